# Set-up, tests, benchmarks and the embedded training run.
#
#   make train   set up, then run the embedded default (python -m learner.train)
#   make base    set up, then rebuild the tiny base model it starts from (shared/assets/tiny_base)
#   make test    set up (with the test dependencies and the engines), then ruff, the docs and the test suite
#   make docs    set up (with the test dependencies), then serve the documentation on 127.0.0.1:8000
#   make bench   set up (with the test dependencies), then every bench/*.py (each ends with one JSON line)
#   make lock    re-resolve the Python dependencies into requirements/*.txt (hashed)
#   make engines  build .venv-sglang / .venv-vllm from their lock files (cached by lock hash)
#
# `setup` is idempotent: Debian packages are installed only when missing, and the
# virtual environment gets the locked packages again only when a lock file changes.
# Python packages come from the hashed lock files in requirements/ and nothing else
# (pip --require-hashes --no-deps): train.txt for `make train`, test.txt (and torch.txt,
# the CPU build of torch) on top of it for `make test`.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-train
TEST_STAMP := $(VENV)/.installed-test
PIP_LOCKED := $(PY) -m pip install -q --require-hashes --no-deps
# PyTorch's CPU wheels (torch.txt pins torch==...+cpu); used only when reachable.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
DEBIAN_PACKAGES := chromium-headless-shell python3.11-doc libjs-jquery tinyproxy microsocks
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The suite runs on every core (pytest-xdist), at most 4 workers; a test file stays on one
# worker, so its module fixtures are built once, and files are handed out in collection
# order (tests/learner, with the longest tests, first; xdist would otherwise start with the
# files that have the most tests and leave the few long ones for the end).
# `make test PYTEST_ARGS=` runs the suite in one process.
PYTEST_ARGS ?= -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

.PHONY: setup setup-test system-packages test lint docs docs-build bench train base lock clean \
	engines engines-sglang engines-vllm

setup: system-packages $(STAMP)

setup-test: setup $(TEST_STAMP)

# Debian packages the project needs: a headless Chromium for the browser modes and
# the Python documentation, which the local web serves as one of its sites; jQuery (which
# that documentation brings too), for the browser tests' pages built with it; tinyproxy and
# microsocks, real http and socks5 proxies the proxy-pool tests start on loopback.
system-packages:
	@missing=""; \
	for p in $(DEBIAN_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if ! $(PYTHON) -c 'import ensurepip, venv' 2>/dev/null; then missing="$$missing python3-venv"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): requirements/train.txt pyproject.toml | $(PY)
	$(PIP_LOCKED) -r requirements/train.txt
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

# The test dependencies (pytest, ruff, the trackers, transformers and the CPU build of
# torch for the parity tests): `make test` and `make bench` only, never `make train`.
$(TEST_STAMP): requirements/test.txt requirements/torch.txt $(STAMP)
	$(PIP_LOCKED) -r requirements/test.txt
	@idx=""; if $(PY) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
	  $(TORCH_INDEX)/torch/ 2>/dev/null; then idx="--extra-index-url $(TORCH_INDEX)"; fi; \
	  echo "$(PIP_LOCKED) $$idx -r requirements/torch.txt"; $(PIP_LOCKED) $$idx -r requirements/torch.txt
	@touch $(TEST_STAMP)

# Re-resolve every Python dependency (newest versions allowed by pyproject.toml) into the
# hashed lock files, with uv. LOCK_ARGS adds uv options, e.g. `-c constraints.txt` to keep
# versions, or `--upgrade-package jax`. The lock is resolved for the venv's Python on
# x86_64 Linux (every file of a pinned version is hashed, so other Pythons >= 3.11 install
# it too, where the pinned versions support them).
LOCK_PLATFORM = --python $(PY) --python-platform x86_64-manylinux_2_28
lock: | $(PY)
	$(PY) -m pip install -q uv
	@mkdir -p requirements
	@links=$$($(PY) -m pip config get global.find-links 2>/dev/null | sed 's/^/--find-links /'); \
	if $(PY) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' \
	  $(TORCH_INDEX)/torch/ 2>/dev/null; then links="$$links --extra-index-url $(TORCH_INDEX) --index-strategy unsafe-best-match"; fi; \
	uv="$(VENV)/bin/uv pip compile -q --generate-hashes $(LOCK_PLATFORM) $$links $(LOCK_ARGS)"; \
	set -e; \
	$$uv pyproject.toml --extra dev --extra hftest --extra trackers -o requirements/all.tmp; \
	$$uv pyproject.toml --extra dev --extra hftest --extra trackers --no-emit-package torch \
	  -c requirements/all.tmp -o requirements/test.txt; \
	{ echo "# torch alone (the CPU build), from the resolution of requirements/test.txt"; \
	  awk '/^[^ #]/ {on = /^torch==/} on' requirements/all.tmp; } > requirements/torch.txt; \
	$$uv pyproject.toml -c requirements/all.tmp -o requirements/train.txt; \
	echo 'mendeleev==1.3.0' | $$uv - --no-deps -o requirements/mendeleev.tmp; \
	grep -v '^#' requirements/mendeleev.tmp >> requirements/train.txt; \
	rm -f requirements/all.tmp requirements/mendeleev.tmp
	@echo "requirements/{train,test,torch}.txt written; \`make setup-test\` installs them"

lint: setup-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The documentation site (mkdocs.yml, docs/): `make test` builds it with --strict into site/
# (a broken link, a missing page or an unknown anchor fails the build); `make docs` serves it
# on loopback, rebuilding on every edit. Nothing is fetched from the network.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs-build: setup-test
	$(MKDOCS) build --strict --quiet --site-dir site

docs: setup-test
	$(MKDOCS) serve --dev-addr 127.0.0.1:8000

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: setup-test engines lint docs-build
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

bench: setup-test
	@for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

train: setup
	$(PY) -m learner.train $(ARGS)

base: setup
	$(PY) -m learner.base $(ARGS)

engines: engines-sglang engines-vllm

engines-sglang:
	PYTHON=$(PYTHON) engines/build.sh sglang

engines-vllm:
	PYTHON=$(PYTHON) engines/build.sh vllm

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis site
