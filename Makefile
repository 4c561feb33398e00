# Set-up, tests, benchmarks and the embedded training run.
#
#   make train   set up, then run the embedded default (python -m learner.train)
#   make base    set up, then rebuild the tiny base model it starts from (shared/assets/tiny_base)
#   make test    set up, then ruff and the test suite
#   make bench   set up, then every bench/*.py (each ends with one JSON line)
#
# `setup` is idempotent: Debian packages are installed only when missing, and the
# virtual environment is rebuilt only when pyproject.toml changes.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEBIAN_PACKAGES := chromium-headless-shell python3.11-doc tinyproxy microsocks
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: setup system-packages test lint bench train base clean

setup: system-packages $(STAMP)

# Debian packages the project needs: a headless Chromium for the browser modes and
# the Python documentation, which the local web serves as one of its sites; tinyproxy and
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

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,hftest]'
	$(PY) -m pip install -q --no-deps mendeleev==1.3.0
	@touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# pytest exits 5 when it collected nothing: that is a failure here, not a pass.
test: lint
	@$(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

bench: setup
	@for f in bench/*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

train: setup
	$(PY) -m learner.train $(ARGS)

base: setup
	$(PY) -m learner.base $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
