#!/usr/bin/env bash
# Usage: launch/inference.sh sglang MODEL_DIR [PORT] [TP]   (GPU node, SGLang)
#        launch/inference.sh vllm MODEL_DIR [PORT] [TP]     (GPU node, vLLM)
#        launch/inference.sh embedded CONFIG [--set k=v ...]   (learner.serve, JAX)
# MODEL_DIR: the policy as HF safetensors (python -m learner.inspect CKPT --export-hf DIR,
# with --untie for vLLM, whose in-place reload needs a tied LM head written untied).
# PYTHON: the interpreter with the engine installed (default: python).
# Tokens in, tokens out: the engines start without a tokenizer; vLLM with its RL and
# token-in/token-out endpoints (VLLM_SERVER_DEV_MODE=1, --enable-scale-out).
# The sidecars reach these servers through inference.urls; weights are updated by
# the learner through POST /weights on the sidecars.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${1:?usage: launch/inference.sh sglang|vllm|embedded ...}; shift
case "$KIND" in
  sglang)
    MODEL=${1:?model dir}; PORT=${2:-30000}; TP=${3:-1}
    exec "${PYTHON:-python}" -m sglang.launch_server --model-path "$MODEL" --host 0.0.0.0 \
      --port "$PORT" --tp-size "$TP" --skip-tokenizer-init ;;
  vllm)
    MODEL=${1:?model dir}; PORT=${2:-30000}; TP=${3:-1}
    VLLM_SERVER_DEV_MODE=1 exec "${PYTHON:-python}" -m vllm.entrypoints.openai.api_server \
      --model "$MODEL" --host 0.0.0.0 --port "$PORT" --tensor-parallel-size "$TP" \
      --skip-tokenizer-init --enable-scale-out --logprobs-mode processed_logprobs ;;
  embedded)
    CONFIG=${1:?config}; shift
    exec python -m learner.serve --init tiny --config "$CONFIG" "$@" ;;
  *) echo "unknown kind $KIND" >&2; exit 2 ;;
esac
