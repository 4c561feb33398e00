"""Stand-in for `sgl_kernel.flash_attn`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

build_bidirectional_block_ids = unavailable("flash_attn.build_bidirectional_block_ids")
flash_attn_varlen_func = unavailable("flash_attn.flash_attn_varlen_func")
flash_attn_with_kvcache = unavailable("flash_attn.flash_attn_with_kvcache")
get_scheduler_metadata = unavailable("flash_attn.get_scheduler_metadata")
