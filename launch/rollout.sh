#!/usr/bin/env bash
# Usage: [SIDECARS=S] [DRY_RUN=1] launch/rollout.sh CONFIG [--set k=v ...] [--run-dir DIR]
# A CPU rollout node: the sidecar (browsers + engine) serving groups to the learner.
# It binds rollout.host:rollout.port; set rollout.host=0.0.0.0 and rollout.auth_token
# to serve other nodes. The checkpoint dir must be the learner's (shared filesystem).
#
# One sidecar's Python process (engine, egress proxy) and its Playwright driver each run
# on one core, which caps a sidecar well below what a many-core node can run
# (bench/rollout.py prints the caps). SIDECARS=S starts S independent sidecars on this
# node; sidecar i (0-based) gets
#   rollout.port      = rollout.port + i   (0 stays 0: each picks a free port)
#   --run-dir           <run dir>-i        (default run dir: <logging.run_dir>/sidecar)
#   rollout.seed      = rollout.seed + i   (its own task order and oracle mistakes)
#   rollout.browsers and rollout.max_concurrent_episodes: its share of the config's,
#                                          ceil(value / S), at least 1
# and its own local web child unless web.url names one. Each line of its output is
# prefixed with [sidecar-i]. SIGTERM/SIGINT stops them all; if one exits, the others
# are stopped and its exit status is returned. Point the learner at every sidecar:
#   --set 'rollout.urls=["http://NODE:8901","http://NODE:8902",...]'
# DRY_RUN=1 prints the commands (one per line) instead of running them.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: [SIDECARS=S] launch/rollout.sh CONFIG [--set k=v ...]}; shift
SIDECARS=${SIDECARS:-1}
if ! [[ $SIDECARS =~ ^[1-9][0-9]*$ ]]; then
  echo "launch/rollout.sh: SIDECARS must be a positive integer, got '$SIDECARS'" >&2; exit 2
fi
if [[ $SIDECARS == 1 && -z ${DRY_RUN:-} ]]; then
  exec python -m rollout.serve --config "$CONFIG" "$@"
fi

# One shell-quoted command per sidecar, from the resolved config.
CMDS=()
while IFS= read -r line; do CMDS+=("$line"); done < <(python - "$SIDECARS" "$CONFIG" "$@" <<'EOF'
import argparse, math, shlex, sys
from pathlib import Path
from shared.config import add_config_args, config_from_args

s, config, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
p = argparse.ArgumentParser()
add_config_args(p)
p.add_argument("--run-dir", default=None)
args, passthrough = p.parse_known_args(["--config", config, *rest])
cfg = config_from_args(args)
r = cfg.rollout
base_dir = args.run_dir or str(Path(cfg.logging.run_dir) / "sidecar")
share = lambda n: max(1, math.ceil(n / s))  # noqa: E731
for i in range(s):
    cmd = ["python", "-m", "rollout.serve", "--config", config]
    for o in args.overrides:
        cmd += ["--set", o]
    cmd += passthrough
    run_dir = base_dir if s == 1 else f"{base_dir}-{i}"
    for k, v in (("rollout.port", r.port + i if r.port else 0), ("rollout.seed", r.seed + i),
                 ("rollout.browsers", share(r.browsers)),
                 ("rollout.max_concurrent_episodes", share(r.max_concurrent_episodes))):
        cmd += ["--set", f"{k}={v}"]
    cmd += ["--run-dir", run_dir]
    print(shlex.join(cmd))
EOF
)
[[ ${#CMDS[@]} == "$SIDECARS" ]] || { echo "launch/rollout.sh: could not resolve $CONFIG" >&2; exit 2; }
if [[ -n ${DRY_RUN:-} ]]; then printf '%s\n' "${CMDS[@]}"; exit 0; fi

pids=()
filters=()
signalled=0
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
}
trap 'signalled=1; stop_all' TERM INT
fifos=$(mktemp -d)
trap 'rm -rf "$fifos"' EXIT
for i in "${!CMDS[@]}"; do
  # each sidecar's output goes through a filter of this script's own (a FIFO, not a
  # process substitution, which would be the sidecar's child and outlive this script)
  mkfifo "$fifos/$i"
  sed -u "s/^/[sidecar-$i] /" < "$fifos/$i" &
  filters+=("$!")
  # exec: the background job *is* the sidecar, so $! is its pid
  eval "exec ${CMDS[$i]}" > "$fifos/$i" 2>&1 &
  pids+=("$!")
done
set +e
wait -n "${pids[@]}"  # the first sidecar to exit, or a signal
rc=$?
stop_all
for p in "${pids[@]}"; do wait "$p"; done
for p in "${filters[@]}"; do wait "$p"; done  # each ends when its sidecar's output does
if (( signalled )); then rc=0; fi  # stopped by SIGTERM/SIGINT: a clean stop
exit "$rc"
