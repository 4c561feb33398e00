#!/usr/bin/env bash
# Usage: launch/inference.sh sglang MODEL_DIR [PORT] [TP]   (GPU node, SGLang)
#        launch/inference.sh embedded CONFIG [--set k=v ...]   (learner.serve, JAX)
# The sidecars reach these servers through inference.urls; weights are updated by
# the learner through POST /weights on the sidecars.
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${1:?usage: launch/inference.sh sglang|embedded ...}; shift
case "$KIND" in
  sglang)
    MODEL=${1:?model dir}; PORT=${2:-30000}; TP=${3:-1}
    exec python -m sglang.launch_server --model-path "$MODEL" --host 0.0.0.0 \
      --port "$PORT" --tp-size "$TP" ;;
  embedded)
    CONFIG=${1:?config}; shift
    exec python -m learner.serve --init tiny --config "$CONFIG" "$@" ;;
  *) echo "unknown kind $KIND" >&2; exit 2 ;;
esac
