#!/usr/bin/env bash
# Usage: launch/rollout.sh CONFIG [--set k=v ...]
# A CPU rollout node: the sidecar (browsers + engine) serving groups to the learner.
# It binds rollout.host:rollout.port; set rollout.host=0.0.0.0 and rollout.auth_token
# to serve other nodes. The checkpoint dir must be the learner's (shared filesystem).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: launch/rollout.sh CONFIG [--set k=v ...]}; shift
exec python -m rollout.serve --config "$CONFIG" "$@"
