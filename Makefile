# hvd_bert: every target first runs the idempotent set-up (seconds once it has run).
VENV ?= .venv
PY := $(VENV)/bin/python
export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: setup test test-quick lint doctor demo demo-phase2 image image-gpu lock clean

setup:
	bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check hvd_bert tests scripts

# The whole suite (scripts/run_tests.sh): the single-process tests on 2 pytest-xdist workers,
# then tests/parallel (real multi-process runs, fake nodes, SLURM) and tests/readme (every
# README code block as written) two modules at a time, then the 25 slowest tests and the time per
# directory. The budget: 25 minutes on 2 cores (docs/development.md).
test: lint
	-bash scripts/slurm_local.sh install   # for tests/parallel/test_slurm.py (skips without it)
	-bash scripts/fake_cluster.sh install  # sshd, for tests/parallel/test_multinode.py
	-bash scripts/build_image.sh install   # podman, runc, debootstrap, squashfs-tools (container tests)
	-bash scripts/build_image.sh cpu       # the image (seconds when up to date), before the suite's clock
	bash scripts/run_tests.sh

# The editing loop, under 5 minutes: the framework-free core and one framework's unit tests
# (FRAMEWORK=pt, the default, or FRAMEWORK=tf); no ranks are started.
test-quick: setup
	QUICK=1 FRAMEWORK=$(FRAMEWORK) bash scripts/run_tests.sh

doctor: setup
	$(VENV)/bin/hvd-bert doctor

# The main job: a tiny BERT pretrained on the built-in corpus by 2 Horovod processes.
DATA ?= $(HOME)/.cache/hvd_bert/data/stdlib-seq128
RUN ?= runs/demo
NP ?= 2
FRAMEWORK ?= pt
demo: setup
	@test -f $(DATA)/dataset.json || $(VENV)/bin/hvd-bert prepare-bert --output $(DATA)
	OMP_NUM_THREADS=1 $(VENV)/bin/hvd-bert pretrain -np $(NP) --framework $(FRAMEWORK) --set data=$(DATA) \
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
	OMP_NUM_THREADS=1 $(VENV)/bin/hvd-bert pretrain -np $(NP) --framework $(FRAMEWORK) --set data=$(DATA512) \
	    --set max_seq_length=512 --set max_predictions_per_seq=80 --set init_checkpoint=$(RUN) \
	    --set train.output_dir=$(RUN)-phase2 --set train.batch.local_batch_size=8 \
	    --set train.batch.backward_passes_per_step=4 --set train.schedule.total_steps=50 \
	    --set train.optim.lr=4e-3 $(ARGS)

# The container image (docker/Dockerfile) with podman, or Docker where its engine runs: the
# frameworks from the wheels of this machine's venv, the cached Horovod wheel, the toolkit as
# the image's non-root user; nothing is rebuilt when nothing changed (scripts/build_image.sh).
image: setup
	bash scripts/build_image.sh install
	bash scripts/build_image.sh cpu

# The GPU image (NGC base, Horovod with NCCL) where nvcr.io is reachable; STAGE=system builds
# only the layers that need no CUDA, on any base (BASE_IMAGE=...).
image-gpu: setup
	bash scripts/build_image.sh gpu $(if $(STAGE),--target $(STAGE))

# Refresh requirements-dev.lock and requirements.lock from requirements*.txt (pip-compile with
# hashes; UPGRADE=1: every package at its newest allowed version). Needs PyPI, not the venv.
lock:
	python3 scripts/lock.py $(if $(UPGRADE),--upgrade)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
