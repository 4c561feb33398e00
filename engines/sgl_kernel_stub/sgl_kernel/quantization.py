"""Stand-in for `sgl_kernel.quantization`: every name raises RuntimeError when called (CPU test scaffolding)."""

from sgl_kernel._stub import unavailable

ggml_dequantize = unavailable("quantization.ggml_dequantize")
ggml_moe_a8 = unavailable("quantization.ggml_moe_a8")
ggml_moe_a8_vec = unavailable("quantization.ggml_moe_a8_vec")
ggml_mul_mat_a8 = unavailable("quantization.ggml_mul_mat_a8")
ggml_mul_mat_vec_a8 = unavailable("quantization.ggml_mul_mat_vec_a8")
