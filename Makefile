# The two set-up commands (see README): `make demo` runs the demo pipeline, `make test` runs
# every test. Each creates .venv and installs what it needs, apt packages included.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test lint unit integration bench apt-test apt-bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,spark]'
	touch $(STAMP)

apt-test:
	@command -v kcat >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq kcat >/dev/null; }
	@# nftables: the Jepsen harness's network partitions (tests/jepsen).
	@command -v nft >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nftables >/dev/null; }

apt-bench:
	@command -v nats-server >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nats-server >/dev/null; }

demo: $(STAMP)
	$(PY) -m spark_connector.demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy raftlog jepsen spark_connector bench

test: $(STAMP) apt-test lint
	$(PY) -m pytest -q -p no:cacheprovider

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

bench: $(STAMP) apt-bench
	$(PY) bench/produce_consume.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
