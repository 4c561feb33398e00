"""Stand-in for `sgl_kernel.utils`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

is_arch_support_pdl = unavailable("utils.is_arch_support_pdl")
