"""CPU-only test scaffolding: a stand-in for SGLang's ``sgl_kernel`` (sgl-kernel / sglang-kernel).

Never used by a GPU install: there the real sgl-kernel provides this import package. SGLang
0.5.23 imports names from ``sgl_kernel`` at module level on its CPU path (for its AMX kernels
and speculative decoding), so without some ``sgl_kernel`` the server cannot even start on a
machine without a GPU, and the published sgl-kernel / sglang-kernel wheels are CUDA builds
(they need libcuda.so.1). This package makes ``import sgl_kernel`` and those
``from sgl_kernel import ...`` lines work; every name here is a function that raises
RuntimeError ("sgl_kernel stand-in: <name> called; ...") if it is ever called, so a code path
that needs a real kernel fails loudly instead of computing anything (each carries
``__sgl_kernel_stub__ = True``). It registers no ``torch.ops.sgl_kernel`` operators, so
SGLang's own checks (``hasattr(torch.ops.sgl_kernel, ...)``) still see no CPU kernels and keep
to plain torch.

Names are listed explicitly: every name SGLang 0.5.23 imports from ``sgl_kernel`` and its
submodules anywhere in its source, except three submodules it imports inside
``try/except ImportError`` with a fallback that works on a CPU and which are therefore left
out on purpose: ``sgl_kernel.scalar_type`` (SGLang substitutes mock scalar types that its
module-level code can use), ``sgl_kernel.allreduce`` and ``sgl_kernel.kvcacheio``.
"""

from sgl_kernel._stub import unavailable

# Imported at start-up on the CPU path (`--device cpu --attention-backend torch_native
# --sampling-backend pytorch`, SGLANG_USE_CPU_ENGINE=1): KV-cache moves and speculative
# decoding helpers. Plain decoding calls none of them.
assign_draft_cache_locs_contiguous_cpu = unavailable("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = unavailable("assign_extend_cache_locs_cpu")
assign_req_to_token_pool_cpu = unavailable("assign_req_to_token_pool_cpu")
build_tree_kernel_efficient_cpu = unavailable("build_tree_kernel_efficient_cpu")
copy_all_layer_kv_cache_cpu = unavailable("copy_all_layer_kv_cache_cpu")
fill_accept_out_cache_loc_cpu = unavailable("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = unavailable("fill_bonus_tokens_cpu")
verify_tree_greedy_cpu = unavailable("verify_tree_greedy_cpu")

# Imported elsewhere: other CPU code paths (some models, speculative decoding) and the
# CUDA / ROCm / XPU / MUSA branches.
apply_token_bitmask_inplace_cuda = unavailable("apply_token_bitmask_inplace_cuda")
awq_dequantize = unavailable("awq_dequantize")
biased_topk = unavailable("biased_topk")
build_draft_decode_metadata_cpu = unavailable("build_draft_decode_metadata_cpu")
build_tree_kernel_efficient = unavailable("build_tree_kernel_efficient")
compress_norm_rope_store = unavailable("compress_norm_rope_store")
concat_mla_k = unavailable("concat_mla_k")
cutlass_w4a8_moe_mm = unavailable("cutlass_w4a8_moe_mm")
es_fp8_blockwise_scaled_grouped_mm = unavailable("es_fp8_blockwise_scaled_grouped_mm")
es_sm100_mxfp8_blockscaled_grouped_mm = unavailable("es_sm100_mxfp8_blockscaled_grouped_mm")
es_sm100_mxfp8_blockscaled_grouped_quant = unavailable("es_sm100_mxfp8_blockscaled_grouped_quant")
fast_topk_transform_fused = unavailable("fast_topk_transform_fused")
fast_topk_transform_ragged_fused = unavailable("fast_topk_transform_ragged_fused")
fast_topk_v2 = unavailable("fast_topk_v2")
flash_compress128_decode = unavailable("flash_compress128_decode")
flash_compress128_prefill = unavailable("flash_compress128_prefill")
flash_compress4_decode = unavailable("flash_compress4_decode")
flash_compress4_prefill = unavailable("flash_compress4_prefill")
flash_mla_decode = unavailable("flash_mla_decode")
flash_mla_decode_get_workspace_size = unavailable("flash_mla_decode_get_workspace_size")
flash_mla_get_workspace_size = unavailable("flash_mla_get_workspace_size")
flash_mla_prefill = unavailable("flash_mla_prefill")
flash_mla_prefill_get_workspace_size = unavailable("flash_mla_prefill_get_workspace_size")
flash_mla_sparse_fwd = unavailable("flash_mla_sparse_fwd")
flash_mla_with_kvcache = unavailable("flash_mla_with_kvcache")
fp8_blockwise_scaled_grouped_mm = unavailable("fp8_blockwise_scaled_grouped_mm")
fp8_mqa_logits = unavailable("fp8_mqa_logits")
fp8_paged_mqa_logits = unavailable("fp8_paged_mqa_logits")
fp8_paged_mqa_logits_triton = unavailable("fp8_paged_mqa_logits_triton")
fused_add_rmsnorm = unavailable("fused_add_rmsnorm")
fused_experts = unavailable("fused_experts")
fused_hc_head = unavailable("fused_hc_head")
fused_inplace_qknorm_rope = unavailable("fused_inplace_qknorm_rope")
fused_k_norm_rope_flashmla = unavailable("fused_k_norm_rope_flashmla")
fused_q_indexer_rope_hadamard_quant = unavailable("fused_q_indexer_rope_hadamard_quant")
fused_q_norm_rope = unavailable("fused_q_norm_rope")
fused_qk_rope_with_cos_sin_cache_inplace = unavailable("fused_qk_rope_with_cos_sin_cache_inplace")
gdn_attention = unavailable("gdn_attention")
gelu_and_mul = unavailable("gelu_and_mul")
gelu_quick = unavailable("gelu_quick")
gelu_tanh_and_mul = unavailable("gelu_tanh_and_mul")
gemma_fused_add_rmsnorm = unavailable("gemma_fused_add_rmsnorm")
gemma_rmsnorm = unavailable("gemma_rmsnorm")
get_cutlass_w4a8_moe_mm_data = unavailable("get_cutlass_w4a8_moe_mm_data")
hadamard_transform = unavailable("hadamard_transform")
hash_topk = unavailable("hash_topk")
hc_post = unavailable("hc_post")
hc_split_sinkhorn = unavailable("hc_split_sinkhorn")
infllmv2_attn_stage1 = unavailable("infllmv2_attn_stage1")
int8_scaled_mm = unavailable("int8_scaled_mm")
load_cache_to_device_buffer_dsv4_mla = unavailable("load_cache_to_device_buffer_dsv4_mla")
load_cache_to_device_buffer_mla = unavailable("load_cache_to_device_buffer_mla")
max_pooling_1d_varlen = unavailable("max_pooling_1d_varlen")
merge_state_v2 = unavailable("merge_state_v2")
mhc_fused_post_pre = unavailable("mhc_fused_post_pre")
mhc_pre = unavailable("mhc_pre")
min_p_sampling_from_probs = unavailable("min_p_sampling_from_probs")
minimax_decode_topk = unavailable("minimax_decode_topk")
moe_fused_gate = unavailable("moe_fused_gate")
moe_sum = unavailable("moe_sum")
moe_sum_reduce = unavailable("moe_sum_reduce")
multimodal_rotary_embedding = unavailable("multimodal_rotary_embedding")
plan_compress_decode = unavailable("plan_compress_decode")
plan_compress_decode_legacy = unavailable("plan_compress_decode_legacy")
plan_compress_prefill = unavailable("plan_compress_prefill")
plan_compress_prefill_legacy = unavailable("plan_compress_prefill_legacy")
rmsnorm = unavailable("rmsnorm")
rotary_embedding = unavailable("rotary_embedding")
rotate_input_ids_cpu = unavailable("rotate_input_ids_cpu")
sgl_per_tensor_quant_fp8 = unavailable("sgl_per_tensor_quant_fp8")
sgl_per_token_quant_fp8 = unavailable("sgl_per_token_quant_fp8")
shuffle_rows = unavailable("shuffle_rows")
silu_and_mul = unavailable("silu_and_mul")
silu_and_mul_clamp = unavailable("silu_and_mul_clamp")
store_cache_xpu = unavailable("store_cache_xpu")
top_k = unavailable("top_k")
top_k_renorm_prob = unavailable("top_k_renorm_prob")
top_k_top_p_sampling_from_probs = unavailable("top_k_top_p_sampling_from_probs")
top_p_renorm_prob = unavailable("top_p_renorm_prob")
topk_sigmoid = unavailable("topk_sigmoid")
topk_softmax = unavailable("topk_softmax")
transfer_cache_dsv4_mla = unavailable("transfer_cache_dsv4_mla")
tree_speculative_sampling_target_only = unavailable("tree_speculative_sampling_target_only")
verify_tree_greedy = unavailable("verify_tree_greedy")
weak_ref_tensor = unavailable("weak_ref_tensor")

# Submodules SGLang imports (`from sgl_kernel import metal, spatial`, `from sgl_kernel.mamba
# import ...`), each with the same raising stand-ins.
from sgl_kernel import elementwise as elementwise  # noqa: E402
from sgl_kernel import flash_attn as flash_attn  # noqa: E402
from sgl_kernel import mamba as mamba  # noqa: E402
from sgl_kernel import metal as metal  # noqa: E402
from sgl_kernel import quantization as quantization  # noqa: E402
from sgl_kernel import spatial as spatial  # noqa: E402
from sgl_kernel import speculative as speculative  # noqa: E402
from sgl_kernel import utils as utils  # noqa: E402
