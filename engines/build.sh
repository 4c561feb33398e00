#!/usr/bin/env bash
# Build the virtual environment of a real inference engine from its hashed lock file.
#
#   engines/build.sh sglang|vllm|all         build (or reuse) .venv-sglang / .venv-vllm
#   engines/build.sh --lock sglang|vllm|all  re-resolve requirements/<engine>.txt from <engine>.in (uv)
#
# A venv lives in ${ENGINES_CACHE:-$HOME/.cache/deep-research-harness/engines}/<engine>-<key>,
# where <key> is the first 16 hex digits of the sha256 of requirements/<engine>.txt (and, for
# sglang, of engines/sgl_kernel_stub's files); it is built only when missing, and
# ".complete" is written last, so a half-built venv is built again. The repo-local
# .venv-<engine> is a symlink to it. Packages come from the lock file alone
# (pip --require-hashes --no-deps); sglang also gets engines/sgl_kernel_stub (--no-deps).
# PYTHON (default python3.11) makes the venv: the locks are resolved for CPython 3.11.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${ENGINES_CACHE:-$HOME/.cache/deep-research-harness/engines}
PYTHON=${PYTHON:-python3.11}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
STUB=engines/sgl_kernel_stub
ENGINES=(sglang vllm)

say() { echo "engines: $*"; }
die() {
	echo "engines: error: $*" >&2
	exit 1
}

# The stub's source files, relative to ROOT, in a stable order (no build leftovers).
stub_files() {
	(cd "$ROOT" && find "$STUB" -type f \
		-not -path '*/__pycache__/*' -not -path '*/build/*' -not -path '*.egg-info/*' | LC_ALL=C sort)
}

cache_key() {
	local engine=$1
	{
		sha256sum "$ROOT/requirements/$engine.txt" | cut -d' ' -f1
		if [ "$engine" = sglang ]; then
			stub_files | while read -r f; do
				echo "$f $(sha256sum "$ROOT/$f" | cut -d' ' -f1)"
			done
		fi
	} | sha256sum | cut -c1-16
}

# The PyTorch CPU index, where it can be reached (vllm's torch==2.13.0+cpu is there, and in
# pip's find-links on the project's machines).
torch_index_args() {
	if "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
		"$TORCH_INDEX/torch/" 2>/dev/null; then
		echo "--extra-index-url $TORCH_INDEX"
	fi
}

build() {
	local engine=$1 lock key dir link start
	lock="$ROOT/requirements/$engine.txt"
	[ -f "$lock" ] || die "$engine: no lock file $lock"
	key=$(cache_key "$engine")
	dir="$CACHE/$engine-$key"
	link="$ROOT/.venv-$engine"
	mkdir -p "$CACHE"
	# One build of a given venv at a time (two checkouts may share the cache).
	exec 9>"$CACHE/.$engine-$key.lock"
	flock 9
	if [ -f "$dir/.complete" ]; then
		say "$engine: cached $dir"
	else
		start=$(date +%s)
		"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' ||
			die "$engine: $PYTHON is not CPython 3.11 (the lock files are resolved for 3.11)"
		"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
			die "$engine: $PYTHON lacks venv/ensurepip (Debian: apt-get install python3-venv)"
		if [ -e "$dir" ]; then
			say "$engine: removing an incomplete build at $dir"
			rm -rf "$dir"
		fi
		say "$engine: building $dir from requirements/$engine.txt"
		"$PYTHON" -m venv "$dir"
		local pip=("$dir/bin/python" -m pip install -q --disable-pip-version-check)
		say "$engine: installing $(grep -c '^[A-Za-z0-9]' "$lock") locked packages (pip --require-hashes --no-deps)"
		# shellcheck disable=SC2046  # the index option is two words or nothing
		"${pip[@]}" --require-hashes --no-deps $([ "$engine" = vllm ] && torch_index_args) -r "$lock" ||
			die "$engine: pip failed (its error is above); $dir is left incomplete and is rebuilt next time"
		if [ "$engine" = sglang ]; then
			say "$engine: installing the CPU stand-in for sgl_kernel ($STUB)"
			local tmp
			tmp=$(mktemp -d)
			# Built from a copy, so that setuptools leaves no build/ or egg-info in the tree.
			(cd "$ROOT" && stub_files | tar -cf - -T -) | tar -xf - -C "$tmp"
			"${pip[@]}" --no-deps --no-build-isolation "$tmp/$STUB" ||
				{ rm -rf "$tmp"; die "$engine: installing $STUB failed (error above)"; }
			rm -rf "$tmp"
		fi
		say "$engine: checking that it imports"
		case $engine in
		sglang) "$dir/bin/python" -c 'import torch, sgl_kernel, sglang.srt.server_args' ;;
		vllm) "$dir/bin/python" -c 'import torch, vllm.entrypoints.openai.api_server' ;;
		esac || die "$engine: the new venv does not import (error above); $dir is left incomplete"
		touch "$dir/.complete"
		say "$engine: built in $(($(date +%s) - start)) s, $(du -sh "$dir" | cut -f1)"
	fi
	exec 9>&-
	if [ -L "$link" ] || [ ! -e "$link" ]; then
		if [ "$(readlink "$link" 2>/dev/null)" != "$dir" ]; then
			ln -sfn "$dir" "$link"
			say "$engine: .venv-$engine -> $dir"
		fi
	else
		die "$engine: $link exists and is not a symlink; move it away first"
	fi
}

# --lock: resolve requirements/<engine>.in with uv into the hashed lock file. Directives in
# the .in file's comments: "# platform: TAG" (uv's --python-platform) and "# exclude: NAME"
# (a requirement of some package that is dropped from the resolution, with the reason).
lock() {
	local engine=$1 src out uv platform overrides links
	src="$ROOT/requirements/$engine.in"
	out="$ROOT/requirements/$engine.txt"
	[ -f "$src" ] || die "$engine: no $src"
	uv=${UV:-}
	[ -n "$uv" ] || uv=$(command -v uv || true)
	[ -n "$uv" ] || [ ! -x "$ROOT/.venv/bin/uv" ] || uv="$ROOT/.venv/bin/uv"
	[ -n "$uv" ] || die "--lock needs uv (pip install uv, or set UV=/path/to/uv)"
	platform=$(sed -n 's/^# platform: *\([^ ]*\).*/\1/p' "$src" | head -1)
	[ -n "$platform" ] || die "$src has no '# platform: TAG' line"
	overrides=$(mktemp)
	sed -n "s/^# exclude: *\([A-Za-z0-9._-]*\).*/\1 ; sys_platform == 'never'/p" "$src" >"$overrides"
	links=()
	for l in $(pip config get global.find-links 2>/dev/null || true); do links+=(--find-links "$l"); done
	say "$engine: resolving $src for $platform ($(wc -l <"$overrides") exclusions)"
	(cd "$ROOT" && "$uv" pip compile -q --generate-hashes --python-version 3.11 \
		--python-platform "$platform" "${links[@]}" --overrides "$overrides" \
		--custom-compile-command "engines/build.sh --lock $engine" \
		"requirements/$engine.in" -o "requirements/$engine.txt") ||
		{ rm -f "$overrides"; die "$engine: uv pip compile failed"; }
	rm -f "$overrides"
	say "$engine: wrote $out ($(grep -c '^[A-Za-z0-9]' "$out") packages)"
}

action=build
if [ "${1:-}" = --lock ]; then
	action=lock
	shift
fi
[ $# -ge 1 ] || die "usage: engines/build.sh [--lock] sglang|vllm|all"
for arg in "$@"; do
	case $arg in
	all) for e in "${ENGINES[@]}"; do $action "$e"; done ;;
	sglang | vllm) $action "$arg" ;;
	*) die "unknown engine '$arg' (sglang, vllm or all)" ;;
	esac
done
