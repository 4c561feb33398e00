"""Stand-in for `sgl_kernel.spatial`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

create_greenctx_stream_by_value = unavailable("spatial.create_greenctx_stream_by_value")
get_sm_available = unavailable("spatial.get_sm_available")
