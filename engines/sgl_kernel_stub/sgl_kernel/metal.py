"""Stand-in for `sgl_kernel.metal`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

rope_pool_fused = unavailable("metal.rope_pool_fused")
