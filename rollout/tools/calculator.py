"""``calculate(expression)``: arithmetic read with :mod:`ast` and walked, never evaluated.

Numbers, ``+ - * / // % **``, unary signs, parentheses and the functions ``round``,
``abs``, ``min``, ``max`` and ``sqrt``; nothing else (no names, attributes,
subscripts, strings, comprehensions). Everything is bounded, so no input can take
long or much memory: the expression's length and node count, exponents, and the
magnitude of every intermediate result. Any failure is a :class:`CalcError` whose
message tells the agent what to fix; nothing else ever escapes :func:`evaluate`.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable

MAX_CHARS = 400  # longest expression read
MAX_NODES = 200  # syntax-tree nodes
MAX_EXPONENT = 64  # largest |exponent| of **
MAX_MAGNITUDE = 10**30  # largest |value| of any intermediate result
MAX_ARGS = 16  # arguments of min/max

Number = int | float


class CalcError(ValueError):
    """An expression the calculator refuses or cannot compute; the message is for the agent."""


def evaluate(expression: str) -> Number:
    """The value of an arithmetic ``expression``, or :class:`CalcError`."""
    if not isinstance(expression, str):
        raise CalcError('the expression must be text, e.g. calculate("3 * (2 + 1)")')
    text = " ".join(expression.split())  # line breaks in an expression are spaces
    if not text:
        raise CalcError('the expression is empty; write e.g. calculate("3 * (2 + 1)")')
    if len(text) > MAX_CHARS:
        raise CalcError(f"the expression is {len(text)} characters long; the limit is {MAX_CHARS}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalcError(f"invalid syntax ({e.msg}){_hint(text)}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError):
        raise CalcError(f"invalid syntax{_hint(text)}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CalcError(f"the expression has {nodes} parts; the limit is {MAX_NODES}")
    try:
        return _value(tree.body)
    except CalcError:
        raise
    except ZeroDivisionError:
        raise CalcError("division by zero") from None
    except (OverflowError, MemoryError, RecursionError, ValueError, TypeError):
        raise CalcError(f"the result is out of range (limit {MAX_MAGNITUDE:.0e})") from None


def _hint(text: str) -> str:
    if "," in text and "(" not in text:
        return "; write numbers without thousands separators: 66987244, not 66,987,244"
    if "%" in text or "$" in text:
        return "; write plain numbers, without % or $ signs"
    return ""


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _value(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalcError(f"only numbers are allowed, not {_shown(node)}")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            return _checked(_power(left, right))
        op = _BINARY.get(type(node.op))
        if op is None:
            raise CalcError(f"the operator in {_shown(node)} is not allowed; use + - * / // % **")
        return _checked(op(left, right))
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Name):
        raise CalcError(
            f"unknown name {node.id!r}: use numbers and the functions "
            + ", ".join(f"{f}()" for f in FUNCTIONS)
        )
    if isinstance(node, ast.Tuple):
        raise CalcError(
            "a comma outside a function call: write numbers without thousands separators"
        )
    raise CalcError(f"{_shown(node)} is not allowed: only numbers, + - * / // % ** and ()")


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalcError(f"the exponent {exponent!r} is too large (limit {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError
    if base < 0 and not float(exponent).is_integer():
        raise CalcError("a negative number to a fractional power has no real value")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > 31:
        raise CalcError(f"the result is out of range (limit {MAX_MAGNITUDE:.0e})")
    return base**exponent


def _checked(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError(f"the result is out of range (limit {MAX_MAGNITUDE:.0e})")
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise CalcError("the result is not a real number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError(f"the result is out of range (limit {MAX_MAGNITUDE:.0e})")
    return value


def _round(x: Number, digits: Number = 0) -> Number:
    if not isinstance(digits, int) or abs(digits) > 15:
        raise CalcError("round(x, n) takes a whole number n between -15 and 15")
    return round(x, digits) if digits else round(x)


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise CalcError("sqrt of a negative number")
    return math.sqrt(x)


FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    # name: (function, fewest arguments, most arguments)
    "round": (_round, 1, 2),
    "abs": (abs, 1, 1),
    "min": (min, 2, MAX_ARGS),
    "max": (max, 2, MAX_ARGS),
    "sqrt": (_sqrt, 1, 1),
}


def _call(node: ast.Call) -> Number:
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in FUNCTIONS or node.keywords:
        raise CalcError(
            f"{_shown(node.func)}(...) is not allowed; the functions are "
            + ", ".join(f"{f}()" for f in FUNCTIONS)
        )
    fn, fewest, most = FUNCTIONS[name]
    if any(isinstance(a, ast.Starred) for a in node.args):
        raise CalcError("* arguments are not allowed")
    if not fewest <= len(node.args) <= most:
        raise CalcError(f"{name}() takes {fewest} to {most} arguments, got {len(node.args)}")
    return _checked(fn(*(_value(a) for a in node.args)))


def _shown(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # unparse of a strange tree: the kind of node is enough
        text = type(node).__name__
    return text if len(text) <= 40 else text[:40] + "…"


def format_number(value: Number) -> str:
    """A result as the calculator shows it: whole numbers as digits, others exactly (repr)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
