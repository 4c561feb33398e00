#!/usr/bin/env bash
# Usage: launch/learner.sh CONFIG [--set k=v ...]
# One learner process per node. Multi-node: set COORDINATOR (host:port of node 0),
# NUM_PROCESSES and PROCESS_ID (or run under `srun`, whose SLURM variables JAX reads).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: launch/learner.sh CONFIG [--set k=v ...]}; shift
EXTRA=()
if [[ -n "${COORDINATOR:-}" ]]; then
  EXTRA+=(--set "mesh.coordinator_address=\"${COORDINATOR}\""
          --set "mesh.num_processes=${NUM_PROCESSES:?}" --set "mesh.process_id=${PROCESS_ID:?}")
fi
exec python -m learner.train --config "$CONFIG" "${EXTRA[@]}" "$@"
