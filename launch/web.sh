#!/usr/bin/env bash
# Usage: launch/web.sh CONFIG [--set k=v ...]
# The local mini-web (pages + search) for the rollout nodes; set web.host=0.0.0.0
# to serve other nodes, and point their web.url at it.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: launch/web.sh CONFIG [--set k=v ...]}; shift
exec python -m rollout.web --config "$CONFIG" "$@"
