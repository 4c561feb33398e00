"""A reward the page defines: read from the browser's current page when the episode ends.

A task names it in ``"reward"``, one of:

- ``{"page_js": "<expression>"}``: a JavaScript expression (or a function of no
  arguments; a promise is awaited) evaluated in the page. Its value is the reward:
  a number, a boolean (``true`` 1.0, ``false`` 0.0) or a string holding one number
  (``"0.5"``);
- ``{"page_text": "<selector>"}``: the text of the first element the Playwright
  selector (CSS by default) matches, parsed as a number by :func:`last_number`:
  the last number in the text (``"Last reward: 0.99"`` -> 0.99);
- ``{"verifier": "<name>"}``: one of the answer verifiers by name (``qa``,
  ``browse_comp``, ``citation``, ``multi_doc``), applied to the answer as if it
  were the task's ``type``. Nothing is read from the page; see
  :mod:`rollout.env.core`.

The value is taken as it is (no clamping, no format tiers, no anti-cheat), and
must be finite. Reading never raises: a script that throws, a selector that
matches nothing, a closed page, a value that is not a number or a read that
outlasts its timeout gives 0.0, with the reason in the breakdown's
``page_reward_error``.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from typing import Any

from rollout.verifiers.scorers import SCORERS

PAGE_KINDS = ("page_js", "page_text")
KINDS = (*PAGE_KINDS, "verifier")

# A number: digits with an optional decimal part and exponent; a sign counts when it
# does not follow a word character ("-0.5" and "x: -1" are negative, "step-2" is 2).
# No thousands separators: "1,234" reads as 1 and 234.
_NUMBER = re.compile(r"(?:(?<!\w)[-+])?(?<![\d.])(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?")


def kind_of(spec: Mapping[str, Any]) -> str:
    """Which of :data:`KINDS` the (valid) spec is."""
    return next(k for k in KINDS if k in spec)


def needs_page(spec: Mapping[str, Any] | None) -> bool:
    return spec is not None and any(k in spec for k in PAGE_KINDS)


def validate(spec: Any) -> None:
    """Raise ``ValueError`` saying what is wrong with a task's ``"reward"``, if anything."""
    if not isinstance(spec, Mapping):
        raise ValueError(f'"reward" must be an object like {{"page_js": "..."}}, not {spec!r}')
    given = [k for k in KINDS if k in spec]
    unknown = sorted(str(k) for k in spec if k not in KINDS)
    if unknown:
        raise ValueError(f'"reward" has unknown keys {unknown}; expected one of {", ".join(KINDS)}')
    if len(given) != 1:
        raise ValueError(
            f'"reward" must name exactly one of {", ".join(KINDS)}; got {given or "none"}'
        )
    kind = given[0]
    value = spec[kind]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'"reward": {kind} must be a non-empty string, not {value!r}')
    if kind == "verifier" and value not in SCORERS:
        raise ValueError(
            f'"reward": unknown verifier {value!r}; expected one of {", ".join(SCORERS)}'
        )


def last_number(text: str) -> float | None:
    """The last number in ``text`` (see :data:`_NUMBER`), or None when it has none."""
    found = _NUMBER.findall(text)
    return float(found[-1]) if found else None


def as_number(value: Any) -> float:
    """A page's value as a reward: a finite number, a boolean or a numeric string."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"not a number: {value[:80]!r}") from None
    else:
        raise ValueError(f"not a number: {_show(value)}")
    if not math.isfinite(number):
        raise ValueError(f"not a finite number: {number}")
    return number


async def read_page_reward(page, spec: Mapping[str, Any], timeout_s: float) -> tuple[float, dict]:
    """The reward ``spec`` reads from ``page`` (a Playwright Page, or None when there is
    none), within ``timeout_s``: ``(value, breakdown parts)``. Never raises: a failed
    read is 0.0 with ``page_reward_error`` saying why."""
    kind = kind_of(spec)
    parts: dict[str, Any] = {"type": "page", "source": kind}
    try:
        if kind not in PAGE_KINDS:
            raise ValueError(f"a {kind} reward is not read from the page")
        if page is None:
            raise ValueError("there is no page to read")
        if page.is_closed():
            raise ValueError("the page is closed")
        value = await asyncio.wait_for(_read(page, kind, spec[kind]), timeout_s)
    except TimeoutError:
        return _failed(parts, f"reading the page took longer than {timeout_s:g} s")
    except ValueError as e:
        return _failed(parts, str(e))
    except Exception as e:  # Playwright: the script threw, the page went away, ...
        return _failed(parts, f"{type(e).__name__}: {_first_line(str(e))}")
    parts.update(score=value, read_ok=True, verdict=verdict(value))
    return value, parts


async def _read(page, kind: str, arg: str) -> float:
    if kind == "page_js":
        return as_number(await page.evaluate(arg))
    element = await page.query_selector(arg)
    if element is None:
        raise ValueError(f"no element matches {arg!r}")
    text = await element.text_content() or ""
    number = last_number(text)
    if number is None:
        raise ValueError(f"no number in the text of {arg!r}: {text.strip()[:80]!r}")
    return as_number(number)


def verdict(value: float) -> str:
    if value >= 1.0:
        return "correct"
    return "partial" if value > 0 else "incorrect"


def _failed(parts: dict[str, Any], why: str) -> tuple[float, dict]:
    parts.update(score=0.0, read_ok=False, verdict="page reward error", page_reward_error=why)
    return 0.0, parts


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
