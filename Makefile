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

# tests/tf runs in its own pytest process: the tfrecord package (used by tests/common, tests/pt)
# and TensorFlow cannot be imported into one process.
test: lint
	$(PY) -m pytest -q -p no:cacheprovider tests/common tests/pt tests/parallel
	$(PY) -m pytest -q -p no:cacheprovider tests/tf

doctor: setup
	$(VENV)/bin/hvd-bert doctor

demo: doctor

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
