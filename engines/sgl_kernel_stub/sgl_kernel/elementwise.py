"""Stand-in for `sgl_kernel.elementwise`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

copy_to_gpu_no_ce = unavailable("elementwise.copy_to_gpu_no_ce")
