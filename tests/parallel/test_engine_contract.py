"""The engine contract, one suite run against each framework's engine under real
`horovodrun -np 2` (both implement ``hvd_bert.train.engine.Engine``): N ranks x k
micro-batches equal one process on the global batch, an inf on one rank skips the step on
every rank, SIGTERM then resume continues bit-identically (dropout on), and both write the
same checkpoint metadata. (Horovod's own suite has no test of gradient accumulation.)

The scenarios that need no Horovod setting of their own share launches: per framework, one
2-rank launch runs every training, skip, SIGTERM and diverge scenario (``CONTRACT``), a second
one the resumes, and one 1-rank launch the resize refusal and its fix (``contract``); the tests
read their scenario's result. A 2-rank launch costs 5-15 s of start-up here, and there were 53.
Tests of Horovod settings read at init (knobs, launcher defaults, timeline) launch alone."""

import functools
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "workers"))
import toy_data  # noqa: E402
import toy_models  # noqa: E402
from closeness import assert_close  # noqa: E402
from conftest import launch_ranks  # noqa: E402

from hvd_bert.train.backend import threads_per_rank  # noqa: E402
from hvd_bert.config import TrainConfig, apply_overrides  # noqa: E402

FRAMEWORKS = ["pt", "tf"]
STEPS = 5
LOCAL_B = 4  # as the worker


@functools.cache
def reference(framework, optim, k, steps, world=2):
    """One process, no Horovod, one global batch of world x 4 x k rows per step: the plain
    framework loop (computed here: PyTorch and TensorFlow share the test process)."""
    cfg = apply_overrides(TrainConfig(), toy_data.overrides(optim, LOCAL_B, k, steps))
    return tuple(toy_models.adapter(framework).reference(cfg, world, LOCAL_B, k, steps))


ACCUMULATION = [("sgd", 3), ("lamb", 3), ("nvlamb", 3), ("lars", 3), ("adamw", 3), ("lamb", 1)]
PRECISIONS = ["fp32", "fp16"]


def contract_scenarios(root: Path) -> list[tuple[int, dict]]:
    """The shared launches' scenarios, in launch order: ``(np, {name: scenario})``."""
    def sc(mode, optim, k, steps, *extra, ckpt=None, kill_at=0):
        return dict(mode=mode, optim=optim, k=k, steps=steps, extra=list(extra),
                    ckpt=str(root / ckpt) if ckpt else None, kill_at=kill_at)
    first = {f"train-{o}-{k}": sc("train", o, k, STEPS) for o, k in ACCUMULATION}
    first.update({
        "predivide": sc("train", "lamb", 2, STEPS, "horovod.gradient_predivide_factor=2.0"),
        "exact": sc("train", "lamb", 2, STEPS),
        "fp16-compression": sc("train", "lamb", 2, STEPS, "horovod.compression=fp16"),
        # init_scale 1024: no natural fp16 overflow on the toy model, only the injected one
        **{f"inf-{p}": sc("inf", "lamb", 2, STEPS, f"precision.mode={p}", "precision.init_scale=1024")
           for p in PRECISIONS},
        **{f"full-{p}": sc("resume", "lamb", 2, 6, f"precision.mode={p}", ckpt=f"a-{p}") for p in PRECISIONS},
        **{f"stopped-{p}": sc("resume", "lamb", 2, 6, f"precision.mode={p}", ckpt=f"b-{p}", kill_at=3)
           for p in PRECISIONS},
        "two": sc("resume", "lamb", 2, 2, ckpt="c"),
        "two-again": sc("resume", "lamb", 2, 2, ckpt="c2"),
        "diverge": sc("diverge", "lamb", 2, 100, "max_skipped_steps=4", ckpt="d"),
    })
    second = {f"resumed-{p}": sc("resume", "lamb", 2, 6, f"precision.mode={p}", ckpt=f"b-{p}")
              for p in PRECISIONS}
    # another global batch, given, is refused even when resizing is allowed
    second["gb"] = sc("resume", "lamb", 1, 4, "batch.global_batch_size=8", ckpt="c")
    # a layout whose k makes another global batch, none given: the checkpoint's is kept (k derived)
    second["kept"] = sc("resume", "lamb", 1, 4, ckpt="c2")
    # one rank with k=4 keeps the global batch of 16, but the world size differs: allowed (the
    # default), and refused with train.resume_resized=false
    one_rank = {"one": sc("resume", "lamb", 4, 4, "resume_resized=false", ckpt="c"),
                "allowed": sc("resume", "lamb", 4, 4, ckpt="c")}
    return [(2, first), (2, second), (1, one_rank)]


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """``contract(framework)``: ``(root, {scenario: [rank 0's result, rank 1's, ...]})`` of the
    shared launches, run once per framework for the whole module; ``root/b-PRECISION-stopped``
    is the SIGTERM-stopped run's folder before the resume."""
    done = {}

    def get(framework):
        if framework not in done:
            root = tmp_path_factory.mktemp(f"contract-{framework}")
            results = {}
            for i, (np_, scenarios) in enumerate(contract_scenarios(root)):
                spec = root / f"scenarios-{i}.json"
                spec.write_text(json.dumps(scenarios))
                ranks = launch_ranks("engine_contract.py", [framework, "batch", spec], root / f"out-{i}",
                                     np=np_, timeout=400)
                for name in scenarios:
                    results[name] = [r["scenarios"][name] for r in ranks]
                if i == 0:  # the stopped runs' folders as they were, before the resumes write on
                    for p in PRECISIONS:
                        shutil.copytree(root / f"b-{p}", root / f"b-{p}-stopped")
            done[framework] = root, results
        return done[framework]
    return get


# every optimizer with accumulation (k=3); without accumulation (k=1) once, with LAMB
@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("optim,k", ACCUMULATION)
def test_two_ranks_with_accumulation_equal_one_process_on_the_global_batch(contract, framework, optim, k):
    ranks = contract(framework)[1][f"train-{optim}-{k}"]
    want = reference(framework, optim, k, STEPS)
    assert ranks[0]["params"] == ranks[1]["params"]  # identical on both ranks
    # fp32: summing k micro-batch means vs one full-batch mean rounds differently; LARS's
    # excluded tensors take raw lr * g steps at lr 2.0. Worst case over 4 seeds of data and
    # weights (tests/bounds/MEASURED.md, Zen 4) as a share of the bound: TensorFlow LARS 0.029
    # (margin 35x), every other pair below 0.009 (113x)
    assert_close(ranks[0]["params"], want, rtol=2e-5, atol=3e-5 if optim == "lars" else 5e-6,
                 site=f"parallel/engine_contract::test_two_ranks_with_accumulation_equal_one_process_on_the_"
                      f"global_batch/{framework}-{optim}")
    assert [s["step"] for s in ranks[0]["steps"]] == list(range(1, STEPS + 1))
    if k > 1:  # before the sync step the ranks hold different local gradients
        assert not np.allclose(ranks[0]["local_grad"], ranks[1]["local_grad"])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_accumulation_is_not_a_no_op(framework):
    """The reference itself distinguishes k: 2 ranks x 4 x 3 is not 2 ranks x 4 x 1."""
    assert not np.allclose(reference(framework, "lamb", 3, STEPS), reference(framework, "lamb", 1, STEPS))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_gradient_predivide_factor_gives_the_same_average(contract, framework):
    ranks = contract(framework)[1]["predivide"]  # worst case 0.004 of the bound, margin 260x
    assert_close(ranks[0]["params"], reference(framework, "lamb", 2, STEPS), rtol=2e-5, atol=5e-6,
                 site=f"parallel/engine_contract::test_gradient_predivide_factor_gives_the_same_average/{framework}")


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_each_launcher_gets_the_measured_cpu_defaults_and_they_take_effect(run_ranks, tmp_path, launcher):
    """No horovod.* settings: a 5 ms cycle under both launchers, and under mpirun MPI's CPU
    operations with OpenMPI yielding while it waits (BENCHMARKS.md); the timeline shows which
    library reduced the gradients. A setting, or the user's own variable, wins; the cores are
    shared between the local ranks unless OMP_NUM_THREADS says how many threads a rank takes."""
    timeline = tmp_path / f"{launcher}.json"
    ranks = run_ranks("engine_contract.py", "pt", "train", "sgd", 1, 3, f"horovod.timeline={timeline}",
                      launcher=launcher)
    want = {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_TIMELINE": str(timeline)}
    want.update({"HOROVOD_CPU_OPERATIONS": "mpi", "OMPI_MCA_mpi_yield_when_idle": "1"} if launcher == "mpi"
                else {"HOROVOD_CPU_OPERATIONS": "gloo"})  # (horovodrun's own)
    assert [r["env"] for r in ranks] == [want] * 2
    assert [r["threads"] for r in ranks] == [threads_per_rank(2)] * 2
    text = timeline.read_text()
    other = "GLOO" if launcher == "mpi" else "MPI"
    assert f"{launcher.upper()}_ALLREDUCE" in text and f"{other}_ALLREDUCE" not in text, \
        sorted(set(re.findall(r'"[A-Z_]+"', text)))
    ranks = run_ranks("engine_contract.py", "pt", "train", "sgd", 1, 2, launcher=launcher,
                      env={"HOROVOD_CYCLE_TIME": "2", "OMP_NUM_THREADS": "3"}, tag="-own")
    assert ranks[0]["env"]["HOROVOD_CYCLE_TIME"] == "2" and [r["threads"] for r in ranks] == [3, 3]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_horovod_knobs_reach_horovod_before_init_and_timeline_and_autotune_take_effect(
        run_ranks, tmp_path, framework):
    """Every horovod.* setting read at init is in the environment before it, on every rank (one
    launch for all of them); horovod.timeline: rank 0 writes Horovod's timeline naming the
    gradients it reduced; horovod.autotune with a log: the log gets autotune's samples."""
    timeline, tune = tmp_path / "t" / "timeline.json", tmp_path / "t" / "autotune.csv"
    ranks = run_ranks("engine_contract.py", framework, "train", "sgd", 1, 40, f"horovod.timeline={timeline}",
                      "horovod.autotune=true", f"horovod.autotune_log={tune}",
                      "horovod.hierarchical_allreduce=false", "horovod.fusion_threshold_mb=4",
                      "horovod.cycle_time_ms=2.5",
                      env={"HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1",
                 "OMP_NUM_THREADS": "3"})
    assert [r["env"] for r in ranks] == [{
        "HOROVOD_TIMELINE": str(timeline), "HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(tune),
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "0", "HOROVOD_FUSION_THRESHOLD": str(4 * 1024 * 1024),
        "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_CPU_OPERATIONS": "gloo"}] * 2  # (horovodrun's own)
    assert [r["threads"] for r in ranks] == [3, 3]  # the user's OMP_NUM_THREADS, in either framework
    text = timeline.read_text()
    assert '"ph"' in text and "ALLREDUCE" in text, text[:500]
    names = set(re.findall(r'"name": "([^"]+)"', text))
    assert any("weight" in n or "kernel" in n or "dense" in n for n in names), sorted(names)[:20]
    rows = tune.read_text().splitlines()
    assert len(rows) >= 2 and "tensor_fusion_threshold" in rows[0], rows[:3]


def test_mpi_cpu_operations_under_gloo_is_one_clear_line(run_ranks):
    res = run_ranks("engine_contract.py", "pt", "train", "sgd", 1, 2, "horovod.cpu_operations=mpi",
                    expect_ok=False)
    assert not res.ok
    assert "horovod.cpu_operations=mpi (HOROVOD_CPU_OPERATIONS=mpi) needs an MPI launch" in res.stderr


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fp16_compression_stays_close_to_uncompressed(contract, framework):
    exact = contract(framework)[1]["exact"][0]["params"]
    fp16 = contract(framework)[1]["fp16-compression"]
    assert fp16[0]["params"] == fp16[1]["params"]
    diff = np.abs(np.array(exact) - np.array(fp16[0]["params"]))
    # fp16 keeps ~3 decimal digits of each gradient; LAMB normalises the update per layer.
    assert 0 < diff.max() < 5e-3


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_inf_on_one_rank_skips_the_step_on_both(contract, framework, precision):
    ranks = contract(framework)[1][f"inf-{precision}"]
    for r in ranks:
        steps = r["steps"]
        assert [s["skipped"] for s in steps] == [False, False, True, False, False]
        skipped = steps[2]
        assert not skipped["changed"], "parameters moved on a skipped step"
        assert skipped["step"] == 2  # the schedule did not advance ...
        assert steps[3]["lr"] == skipped["lr"]  # ... the next step uses the same LR
        assert steps[-1]["step"] == STEPS - 1
        if precision == "fp16":
            assert [s["scale"] for s in steps[1:4]] == [1024.0, 512.0, 512.0]
    assert ranks[0]["params"] == ranks[1]["params"]


def read_meta(ckpt: Path) -> dict:
    if ckpt.suffix == ".pt":
        import torch
        return json.loads(torch.load(ckpt, weights_only=True)["meta"])
    return json.loads((ckpt / "meta.json").read_text())


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_sigterm_saves_and_resume_continues_bit_identically(contract, framework, precision):
    """Dropout on, per-rank RNG streams: resuming restores parameters, optimizer and loss
    scale, the data position and every rank's RNG, so the trajectory is the same to the bit."""
    root, runs = contract(framework)
    full, stopped = runs[f"full-{precision}"], runs[f"stopped-{precision}"]
    ckpt = root / f"b-{precision}-stopped"
    assert [(r["stopped"], r["steps"]) for r in stopped] == [(True, 3), (True, 3)]
    suffix = framework
    names = sorted(p.name for p in ckpt.glob("ckpt-*"))
    assert names == [f"ckpt-00000002.{suffix}", f"ckpt-00000003.{suffix}"]
    # fit() on a run folder writes what the jobs write beside the checkpoints (no lock: not a job's)
    assert {p.name for p in ckpt.iterdir()} - {p.name for p in ckpt.glob("ckpt-*")} <= \
        {"metrics.jsonl", "tensorboard", "config.json"}
    resumed = runs[f"resumed-{precision}"]
    assert [r["steps"] for r in resumed] == [6, 6]
    assert [h["step"] for h in resumed[0]["history"]] == [4, 5, 6]  # it went on from step 3
    for r in (0, 1):
        assert resumed[r]["params"] == full[r]["params"]
    assert full[0]["params"] == full[1]["params"]
    assert full[0]["params"] != stopped[0]["params"]
    losses_full = {h["step"]: h["loss"] for h in full[0]["history"]}
    assert all(losses_full[h["step"]] == h["loss"] for h in resumed[0]["history"])
    # the same metadata schema in both frameworks
    meta = read_meta(ckpt / f"ckpt-00000003.{suffix}")
    assert {k: meta[k] for k in ("format", "step", "world_size", "backward_passes_per_step",
                                 "local_batch_size", "global_batch_size")} == {
        "format": 1, "step": 3, "world_size": 2, "backward_passes_per_step": 2, "local_batch_size": 4,
        "global_batch_size": 16}
    # fp16 may skip a step on an overflow: every window of k micro-batches is one step or one skip
    micro = (meta["step"] + meta["skipped_steps"]) * 2
    assert meta["micro_step"] == micro and meta["data"] == {"micro_step": micro} and len(meta["rng"]) == 2
    assert meta["rng"][0] != meta["rng"][1]  # every rank's own stream


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_resume_on_another_world_size_is_refused_with_the_fix(contract, framework):
    runs = contract(framework)[1]
    assert [r["steps"] for r in runs["two"]] == [2, 2]
    # one rank with k=4 keeps the global batch of 16, but the world size differs (refused when asked)
    error = runs["one"][0]["error"]
    assert "written by 2 data-parallel replicas (2 ranks, k=2)" in error, error
    assert "train.resume_resized=true" in error, error
    # another global batch, given, is refused even when resizing is allowed, on every rank
    assert all("global batch of 16, this run has 8" in r["error"] for r in runs["gb"]), runs["gb"]
    allowed = runs["allowed"]
    assert allowed[0]["steps"] == 4 and [h["step"] for h in allowed[0]["history"]] == [3, 4]
    # k=1 on 2 ranks would make 8: the checkpoint's 16 is kept with k=2, on every rank
    kept = runs["kept"]
    assert [r["steps"] for r in kept] == [4, 4] and [h["step"] for h in kept[0]["history"]] == [3, 4], kept


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_diverged_run_stops_with_a_clear_error_and_writes_no_checkpoint(contract, framework):
    root, runs = contract(framework)
    errors = [r["error"] for r in runs["diverge"]]  # raised on every rank
    assert all(e.startswith("DivergedError: ") and "the last 4 optimizer steps were all skipped" in e
               for e in errors), errors
    assert not list((root / "d").glob("ckpt-*"))  # the loop stopped before any (non-finite) checkpoint
