# hvd_bert: every target first runs the idempotent set-up (seconds once it has run).
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup test lint doctor demo demo-phase2 clean

setup:
	bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check hvd_bert tests scripts

# One pytest process for the whole suite (hvd_bert.common imports no framework, and PyTorch and
# TensorFlow share a process); tests/parallel starts real multi-process runs; tests/readme runs
# every README code block as written (alone: pytest -m readme tests/readme).
test: lint
	-bash scripts/slurm_local.sh install   # for tests/parallel/test_slurm.py (skips without it)
	-bash scripts/fake_cluster.sh install  # sshd, for tests/parallel/test_multinode.py
	$(PY) -m pytest -q -p no:cacheprovider --durations=40 tests/common tests/pt tests/tf tests/parallel \
	    tests/readme

doctor: setup
	$(VENV)/bin/hvd-bert doctor

# The main job: a tiny BERT pretrained on the built-in corpus by 2 Horovod processes.
DATA ?= $(HOME)/.cache/hvd_bert/data/stdlib-seq128
RUN ?= runs/demo
NP ?= 2
FRAMEWORK ?= pt
demo: setup
	@test -f $(DATA)/dataset.json || $(VENV)/bin/hvd-bert prepare-bert --output $(DATA)
	OMP_NUM_THREADS=1 $(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo \
	    $(VENV)/bin/hvd-bert pretrain --framework $(FRAMEWORK) --set data=$(DATA) \
	    --set train.output_dir=$(RUN) $(ARGS)
	@echo "checkpoints and logs: $(RUN)/ (metrics.jsonl, tensorboard/); run it again to resume;"
	@echo "TensorFlow: make demo FRAMEWORK=tf RUN=runs/demo-tf; more processes: make demo NP=4;"
	@echo "your corpus: hvd-bert prepare-bert --input FILES --output DIR, then make demo DATA=DIR;"
	@echo "other settings: make demo ARGS='--set train.optim.lr=1e-2'; phase 2: make demo-phase2"

# Phase 2: sequence length 512 from the demo's phase-1 weights, optimizer and schedule reset; the
# data comes from the phase-1 run's own text, vocab and case (prepare-bert --like).
DATA512 ?= $(RUN)-data512
demo-phase2: setup
	@test -f $(DATA512)/dataset.json || $(VENV)/bin/hvd-bert prepare-bert --like $(RUN) \
	    --output $(DATA512) --max-seq-length 512 --max-predictions-per-seq 80
	OMP_NUM_THREADS=1 $(VENV)/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo \
	    $(VENV)/bin/hvd-bert pretrain --framework $(FRAMEWORK) --set data=$(DATA512) \
	    --set max_seq_length=512 --set max_predictions_per_seq=80 --set init_checkpoint=$(RUN) \
	    --set train.output_dir=$(RUN)-phase2 --set train.batch.local_batch_size=8 \
	    --set train.batch.backward_passes_per_step=4 --set train.schedule.total_steps=50 \
	    --set train.optim.lr=4e-3 $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
