"""Stand-in for `sgl_kernel.mamba`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

causal_conv1d_fn_cpu = unavailable("mamba.causal_conv1d_fn_cpu")
causal_conv1d_update_cpu = unavailable("mamba.causal_conv1d_update_cpu")
chunk_gated_delta_rule_cpu = unavailable("mamba.chunk_gated_delta_rule_cpu")
