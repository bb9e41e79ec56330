# hvd_bert: every target first runs the idempotent set-up (seconds once it has run).
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup test lint doctor demo clean

setup:
	bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check hvd_bert tests scripts

test: lint
	$(PY) -m pytest -q -p no:cacheprovider tests

doctor: setup
	$(VENV)/bin/hvd-bert doctor

demo: doctor

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
