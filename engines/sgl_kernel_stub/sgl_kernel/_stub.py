"""The one helper behind every name in this stand-in: a function that raises when called."""

from collections.abc import Callable
from typing import Any, NoReturn

MESSAGE = (
    "sgl_kernel stand-in: {name} called; this CPU test scaffolding has no kernels"
    " — install the real sgl-kernel on a GPU"
)


def unavailable(name: str) -> Callable[..., NoReturn]:
    """A stand-in for ``sgl_kernel``'s ``name`` (``"rmsnorm"``, ``"mamba.causal_conv1d_fn_cpu"``).

    It raises RuntimeError when called; ``__sgl_kernel_stub__`` marks it as a stand-in.
    """
    module, _, short = name.rpartition(".")

    def stub(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(MESSAGE.format(name=name))

    stub.__name__ = stub.__qualname__ = short
    stub.__module__ = f"sgl_kernel.{module}" if module else "sgl_kernel"
    stub.__doc__ = f"Stand-in for sgl_kernel's {name}: raises RuntimeError when called."
    stub.__sgl_kernel_stub__ = True  # type: ignore[attr-defined]
    return stub
