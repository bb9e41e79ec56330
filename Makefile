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
	-bash scripts/slurm_local.sh install   # for tests/parallel/test_slurm.py (skips without it)
	$(PY) -m pytest -q -p no:cacheprovider tests/common tests/pt tests/parallel
	$(PY) -m pytest -q -p no:cacheprovider tests/tf

doctor: setup
	$(VENV)/bin/hvd-bert doctor

# The main job: a tiny BERT pretrained on the built-in corpus by 2 Horovod processes.
DATA ?= $(HOME)/.cache/hvd_bert/data/stdlib-seq128
RUN ?= runs/demo
NP ?= 2
demo: setup
	@test -f $(DATA)/dataset.json || $(VENV)/bin/hvd-bert prepare-bert --output $(DATA)
	OMP_NUM_THREADS=1 $(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo \
	    $(VENV)/bin/hvd-bert pretrain --framework pt --set data=$(DATA) --set train.output_dir=$(RUN) $(ARGS)
	@echo "checkpoints and logs: $(RUN)/ (metrics.jsonl, tensorboard/); run it again to resume;"
	@echo "more processes: make demo NP=4; your corpus: hvd-bert prepare-bert --input FILES --output DIR,"
	@echo "then make demo DATA=DIR; other settings: make demo ARGS='--set train.optim.lr=1e-2'"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
