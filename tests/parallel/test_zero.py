"""ZeRO stages 1 and 2 (``train.zero.stage``; hvd_bert/pt/zero.py, hvd_bert/tf/zero.py) against
stage 0 under real ``horovodrun``, on 2 and 4 ranks, in both frameworks: every optimizer with
gradient accumulation gives stage 0's weights to fp32 round-off, an inf on one rank skips the
same steps (fp32 and fp16 loss scaling), a stage-1/2 checkpoint holds stage 0's optimizer
state in stage 0's format, and a run stopped at one stage and world size resumes at another on
the same trajectory.

The scenarios share launches (the engine contract's worker in batch mode): per framework, one
2-rank launch for the trainings and the stopped runs, one 4-rank launch for the trainings and
the resumes on 4 ranks, one 2-rank launch for the resumes on 2."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from closeness import assert_close  # noqa: E402
from conftest import launch_ranks  # noqa: E402

FRAMEWORKS = ["pt", "tf"]
OPTIMS = ["sgd", "lamb", "nvlamb", "lars", "adamw", "lion"]  # lion: added as docs/architecture.md says
STAGES = [0, 1, 2]
STEPS = 5
# a bucket of 100 bytes: the toy model's 244 parameters go out in several buckets, several in flight
SMALL_BUCKET = "zero.bucket_mb=0.0001"
SHARDED = "checkpoint_format=sharded"
BF16 = "precision.mode=bf16"
BF16_WEIGHTS = "precision.weights=bf16"  # PyTorch: bf16 weights over fp32 masters in the shards


def sc(mode, optim, k, steps, *extra, ckpt=None, kill_at=0):
    return dict(mode=mode, optim=optim, k=k, steps=steps, extra=list(extra), ckpt=ckpt, kill_at=kill_at)


# on 4 ranks TensorFlow runs LAMB and LARS only (4 TensorFlow processes on the suite's 2 cores
# cost a minute a scenario batch; the other optimizers' sharded step is the same code as LAMB's)
FOUR_RANK_OPTIMS = {"pt": OPTIMS, "tf": ["lamb", "lars"]}


def launches(root: Path, framework: str) -> list[tuple[int, dict]]:
    def ck(name):
        return str(root / name)
    two = {f"train-{o}-{s}": sc("train", o, 3, STEPS, f"zero.stage={s}", SMALL_BUCKET)
           for o in OPTIMS for s in STAGES}
    for p in ("fp32", "fp16"):
        two.update({f"inf-{p}-{s}": sc("inf", "lamb", 2, STEPS, f"zero.stage={s}", f"precision.mode={p}",
                                       "precision.init_scale=1024") for s in STAGES})
    two.update({f"rollback-{s}": sc("rollback", "lamb", 3, STEPS, f"zero.stage={s}", SMALL_BUCKET)
                for s in STAGES})
    two["fp16-compression-1"] = sc("train", "lamb", 2, STEPS, "zero.stage=1", "horovod.compression=fp16")
    two["exact-1"] = sc("train", "lamb", 2, STEPS, "zero.stage=1")
    # checkpoints after 4 steps at each stage (dropout on, fit's loop)
    two.update({f"ckpt-{s}": sc("resume", "lamb", 2, 4, f"zero.stage={s}", ckpt=ck(f"run-{s}"))
                for s in STAGES})
    # stopped by SIGTERM after step 3 at stage 1 and at stage 0; one run of 6 steps at stage 0
    two["stop-1"] = sc("resume", "lamb", 2, 6, "zero.stage=1", ckpt=ck("from-1"), kill_at=3)
    two["stop-0"] = sc("resume", "lamb", 2, 6, "zero.stage=0", ckpt=ck("from-0"), kill_at=3)
    two["whole"] = sc("resume", "lamb", 2, 6, "zero.stage=0", ckpt=ck("whole"))
    # sharded checkpoints (train.checkpoint_format=sharded): each rank writes its own shard
    two["stop-1-sh"] = sc("resume", "lamb", 2, 6, "zero.stage=1", SHARDED, ckpt=ck("from-1-sh"), kill_at=3)
    two["ckpt-1-sh"] = sc("resume", "lamb", 2, 4, "zero.stage=1", SHARDED, ckpt=ck("run-1-sh"))
    four = {f"train-{o}-{s}": sc("train", o, 3, STEPS, f"zero.stage={s}", SMALL_BUCKET)
            for o in FOUR_RANK_OPTIMS[framework] for s in STAGES}
    # the stage-1 run of 2 ranks x 2 micro-batches resumed on 4 ranks x 1 (the same global batch)
    four.update({f"resized-{s}": sc("resume", "lamb", 1, 6, f"zero.stage={s}", "resume_resized=true",
                                    ckpt=ck(f"resized-{s}")) for s in (0, 2)})
    four["resized-2-sh"] = sc("resume", "lamb", 1, 6, "zero.stage=2", "resume_resized=true", SHARDED,
                              ckpt=ck("resized-2-sh"))
    again = {"resume-2-from-1": sc("resume", "lamb", 2, 6, "zero.stage=2", ckpt=ck("from-1")),
             "resume-1-from-0": sc("resume", "lamb", 2, 6, "zero.stage=1", ckpt=ck("from-0")),
             "resume-0-from-1-sh": sc("resume", "lamb", 2, 6, "zero.stage=0", SHARDED, ckpt=ck("from-1-sh"))}
    if framework == "pt":
        two["bf16-0"] = sc("train", "lamb", 3, STEPS, "zero.stage=0", BF16)  # fp32 weights: the reference
        two.update({f"bf16w-{s}": sc("train", "lamb", 3, STEPS, f"zero.stage={s}", BF16, BF16_WEIGHTS,
                                     SMALL_BUCKET) for s in STAGES})
        two["bf16w-stop-2"] = sc("resume", "lamb", 2, 6, "zero.stage=2", BF16, BF16_WEIGHTS, SHARDED,
                                 ckpt=ck("from-bf16w"), kill_at=3)
        two["bf16w-whole"] = sc("resume", "lamb", 2, 6, "zero.stage=2", BF16, BF16_WEIGHTS, ckpt=ck("bf16w"))
        # the bf16-weight run's checkpoint resumed at stage 2 and 1 in bf16 weights, at stage 0 in fp32
        again["resume-bf16w-2"] = sc("resume", "lamb", 2, 6, "zero.stage=2", BF16, BF16_WEIGHTS, SHARDED,
                                     ckpt=ck("from-bf16w"))
        again["resume-bf16w-1"] = sc("resume", "lamb", 2, 6, "zero.stage=1", BF16, BF16_WEIGHTS,
                                     ckpt=ck("from-bf16w-1"))
        again["resume-fp32w-0"] = sc("resume", "lamb", 2, 6, "zero.stage=0", BF16, ckpt=ck("from-bf16w-fp32"))
    return [(2, two), (4, four), (2, again)]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    import shutil
    done = {}

    def get(framework):
        if framework not in done:
            root = tmp_path_factory.mktemp(f"zero-{framework}")
            results = {}
            for i, (np_, scenarios) in enumerate(launches(root, framework)):
                if i == 1:  # both resized runs start from the stopped stage-1 run's folder
                    for s in (0, 2):
                        shutil.copytree(root / "from-1", root / f"resized-{s}")
                    shutil.copytree(root / "from-1-sh", root / "resized-2-sh")
                if i == 2 and (root / "from-bf16w").exists():
                    for copy in ("from-bf16w-1", "from-bf16w-fp32"):
                        shutil.copytree(root / "from-bf16w", root / copy)
                spec = root / f"scenarios-{i}.json"
                spec.write_text(json.dumps(scenarios))
                ranks = launch_ranks("engine_contract.py", [framework, "batch", spec], root / f"out-{i}",
                                     np=np_, timeout=500)
                for name in scenarios:
                    results[np_, name] = [r["scenarios"][name] for r in ranks]
            done[framework] = root, results
        return done[framework]
    return get


@pytest.fixture(params=FRAMEWORKS)
def runs(request, launched):
    """``(root, {(np, scenario): [each rank's result]})`` of one framework's launches."""
    return (*launched(request.param), request.param)


def _params(runs, np_, name):
    ranks = runs[1][np_, name]
    assert all("error" not in r for r in ranks), ranks[0]
    assert all(r["params"] == ranks[0]["params"] for r in ranks)  # every rank holds the same model
    return ranks[0]["params"]


CASES = [(fw, np_, optim, stage) for fw in FRAMEWORKS for np_ in (2, 4)
         for optim in (OPTIMS if np_ == 2 else FOUR_RANK_OPTIMS[fw]) for stage in (1, 2)]


@pytest.mark.parametrize("framework,np_,optim,stage", CASES)
def test_stage_gives_stage_0s_weights(launched, framework, np_, optim, stage):
    runs = (*launched(framework), framework)
    want = _params(runs, np_, f"train-{optim}-0")
    got = _params(runs, np_, f"train-{optim}-{stage}")
    assert_close(got, want, rtol=1e-5, atol=1e-6,
                 site=f"parallel/zero::test_stage_gives_stage_0s_weights/{runs[2]}-{optim}")
    steps = runs[1][np_, f"train-{optim}-{stage}"][0]["steps"]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))


@pytest.mark.parametrize("np_", [2, 4])
def test_a_rank_holds_1_over_n_of_the_optimizer_state_and_at_stage_2_of_the_gradients(runs, np_):
    """The toy model's 244 parameters: every rank holds ceil(244 / N) of each state buffer."""
    for optim, buffers in [("lamb", 2), ("adamw", 2), ("lars", 1), ("sgd", 1)]:
        if optim not in FOUR_RANK_OPTIMS[runs[2]] and np_ == 4:
            continue
        full = runs[1][np_, f"train-{optim}-0"]
        assert all(r["memory"]["optimizer_state"] == 244 * 4 * buffers for r in full), optim
        for stage in (1, 2):
            for r in runs[1][np_, f"train-{optim}-{stage}"]:
                m = r["memory"]
                assert m["optimizer_state"] == -(-244 // np_) * 4 * buffers, (optim, stage)
                assert m["gradients"] == (244 * 4 if stage == 1 else -(-244 // np_) * 4)
                assert m["zero_stage"] == stage and m["world_size"] == np_ and m["parameters"] == 244 * 4


def test_training_moved_the_weights(runs):
    """The comparison above is of runs that trained: the first 4 steps changed every optimizer's
    weights at every stage (the 5th has LR 0, the end of the decay: only LARS's momentum moves)."""
    for np_ in (2, 4):
        for optim in OPTIMS if np_ == 2 else FOUR_RANK_OPTIMS[runs[2]]:
            for stage in STAGES:
                log = runs[1][np_, f"train-{optim}-{stage}"][0]["steps"]
                assert [s["changed"] for s in log[:4]] == [True] * 4, (np_, optim, stage)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("stage", [1, 2])
def test_an_inf_on_one_rank_skips_the_same_steps_on_every_rank(runs, precision, stage):
    base = runs[1][2, f"inf-{precision}-0"]
    got = runs[1][2, f"inf-{precision}-{stage}"]
    for rank in got:
        assert [(s["step"], s["skipped"], s["scale"]) for s in rank["steps"]] == \
            [(s["step"], s["skipped"], s["scale"]) for s in base[0]["steps"]]
    assert [s["skipped"] for s in got[0]["steps"]] == [False, False, True, False, False]
    assert not got[0]["steps"][2]["changed"]
    assert_close(_params(runs, 2, f"inf-{precision}-{stage}"), _params(runs, 2, f"inf-{precision}-0"),
                 rtol=1e-5, atol=1e-6,
                 site=f"parallel/zero::test_an_inf_on_one_rank_skips_the_same_steps/{runs[2]}-{precision}")


@pytest.mark.parametrize("stage", STAGES)
def test_an_elastic_rollback_to_a_commit_continues_the_same_trajectory(runs, stage):
    """What Horovod elastic does after a lost rank: the state committed after step 2 (ZeRO: every
    rank keeps the whole optimizer state), steps 3 and 4, back to the commit, sync (ZeRO: the
    state split again over the world, each rank taking its shard of rank 0's), steps 3 to 5:
    the run without the detour, to round-off."""
    assert_close(_params(runs, 2, f"rollback-{stage}"), _params(runs, 2, f"train-lamb-{stage}"),
                 rtol=1e-5, atol=1e-6,
                 site=f"parallel/zero::test_an_elastic_rollback_to_a_commit/{runs[2]}")


def test_fp16_compression_of_the_reduce_scatter_stays_close(runs):
    exact = np.array(_params(runs, 2, "exact-1"))
    diff = np.abs(exact - np.array(_params(runs, 2, "fp16-compression-1")))
    # fp16 keeps ~3 decimal digits of each gradient; LAMB normalises the update per layer
    assert 0 < diff.max() < 5e-3


def _checkpoint(folder: Path, framework: str) -> dict:
    """Every value of the newest checkpoint in ``folder`` by name: PyTorch's model and optimizer
    state (its param_groups as text), or every variable of TensorFlow's object graph."""
    if framework == "pt":
        import torch
        (path,) = sorted(folder.glob("ckpt-*.pt"))[-1:]
        ckpt = torch.load(path, weights_only=True)
        out = {f"model/{k}": t.numpy() for k, t in ckpt["model"].items()}
        out.update({f"state/{i}/{k}": t.numpy() for i, st in ckpt["optimizer"]["state"].items()
                    for k, t in st.items()})
        out["param_groups"] = repr(ckpt["optimizer"]["param_groups"])
        return out
    import tensorflow as tf
    (path,) = sorted(folder.glob("ckpt-*.tf"))[-1:]
    reader = tf.train.load_checkpoint(str(path / "ckpt"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if "CHECKPOINTABLE_OBJECT_GRAPH" not in k}


def test_a_checkpoint_holds_stage_0s_optimizer_state_in_its_format(runs):
    """Every name, shape and dtype of stage 0's checkpoint, and its values to round-off (after 4
    steps of LAMB with dropout: the moments, the step counters, the weights)."""
    ref = _checkpoint(runs[0] / "run-0", runs[2])
    assert any("exp_avg" in k or "_variables" in k for k in ref)
    for stage in (1, 2):
        got = _checkpoint(runs[0] / f"run-{stage}", runs[2])
        assert sorted(got) == sorted(ref)
        for k, want in ref.items():
            if isinstance(want, str):
                assert got[k] == want, k
                continue
            have = np.asarray(got[k])
            assert have.shape == np.shape(want) and have.dtype == np.asarray(want).dtype, k
            if have.dtype.kind == "f":
                # the moments of 4 steps whose gradients carry the weights' round-off (second moments
                # of gradients ~1e-3 are ~1e-6: a relative bound)
                assert_close(have, want, rtol=1e-4, atol=1e-10,
                             site=f"parallel/zero::test_a_checkpoint_holds_stage_0s_optimizer_state/{runs[2]}")
            else:
                assert np.array_equal(have, want), k


@pytest.mark.parametrize("resumed,stopped", [("resume-2-from-1", "stop-1"), ("resume-1-from-0", "stop-0")])
def test_a_run_stopped_at_one_stage_resumes_at_another_on_the_same_trajectory(runs, resumed, stopped):
    first = runs[1][2, stopped][0]
    assert first["stopped"] and first["steps"] == 3
    got = runs[1][2, resumed][0]
    assert got["steps"] == 6 and not got["stopped"]
    assert_close(_params(runs, 2, resumed), _params(runs, 2, "whole"), rtol=1e-5, atol=1e-6,
                 site=f"parallel/zero::test_a_run_stopped_at_one_stage_resumes_at_another/{runs[2]}")


def test_a_stage_1_checkpoint_resumes_on_another_world_size_at_another_stage(runs):
    """2 ranks x 2 micro-batches at stage 1, stopped after step 3, resumed on 4 ranks x 1: at stage
    2 as at stage 0 (each rank gets its shard of the consolidated state)."""
    for s in (0, 2):
        assert runs[1][4, f"resized-{s}"][0]["steps"] == 6
    assert_close(_params(runs, 4, "resized-2"), _params(runs, 4, "resized-0"), rtol=1e-5, atol=1e-6,
                 site=f"parallel/zero::test_a_stage_1_checkpoint_resumes_on_another_world_size/{runs[2]}")


def test_a_sharded_checkpoint_resumes_at_another_stage_and_world_size_on_the_same_trajectory(runs):
    """Stopped by SIGTERM after step 3 at stage 1 on 2 ranks, its background save waited for: the
    sharded checkpoint resumes at stage 0 on 2 ranks as the uninterrupted run, and at stage 2 on 4
    ranks x 1 micro-batch as the consolidated checkpoint of the same stop resumed there."""
    first = runs[1][2, "stop-1-sh"][0]
    assert first["stopped"] and first["steps"] == 3
    # (the resumed run went on in the same folder: its checkpoints are sharded too, each complete)
    folders = sorted((runs[0] / "from-1-sh").glob("ckpt-*"))
    assert folders and all(p.suffix == ".shards" and (p / "index.json").is_file() for p in folders)
    site = f"parallel/zero::test_a_sharded_checkpoint_resumes/{runs[2]}"
    assert_close(_params(runs, 2, "resume-0-from-1-sh"), _params(runs, 2, "whole"), rtol=1e-5, atol=1e-6,
                 site=site)
    assert_close(_params(runs, 4, "resized-2-sh"), _params(runs, 4, "resized-0"), rtol=1e-5, atol=1e-6,
                 site=site)


def test_a_sharded_checkpoint_holds_the_weights_of_the_consolidated_one(runs):
    """What ``hvd-bert convert`` reads of a sharded checkpoint (every weight, whole) equals the
    consolidated checkpoint's weights after the same 4 steps at stage 1 (TensorFlow's toy model
    has no portable names: its values, in order, against the run's own)."""
    from hvd_bert.train.sharded_checkpoint import Reader

    (folder,) = sorted((runs[0] / "run-1-sh").glob("ckpt-*.shards"))[-1:]
    site = f"parallel/zero::test_a_sharded_checkpoint_holds/{runs[2]}"
    if runs[2] == "pt":
        from hvd_bert.pt.models.bert import read_checkpoint_weights
        got, _ = read_checkpoint_weights(folder)  # (what convert and predict read)
        want = {k[len("model/"):]: v for k, v in _checkpoint(runs[0] / "run-1", "pt").items()
                if k.startswith("model/")}
        assert sorted(got) == sorted(want)
        for k in want:
            assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, site=site)
        return
    reader = Reader(folder)
    got = np.sort(np.concatenate([reader.read(n) for n in reader.names("model/")]))
    assert_close(got, np.sort(np.array(_params(runs, 2, "ckpt-1-sh"), dtype=np.float32)), rtol=0, atol=0,
                 site=site)


# ---------------------------------------------------------------------- bf16 weights, fp32 masters
# 5 LAMB steps of the toy model under bf16 autocast: bf16 weights over fp32 masters against fp32
# weights. The weights differ by their bf16 rounding (2^-9 of each) and what the rounded weights'
# forward passes change: bound measured over 6 seed shifts (tests/bounds/MEASURED.md: worst 0.36 of
# it here, 0.11 for the resumes in another precision or stage; a resume at the same stage is exact).
BF16_RTOL, BF16_ATOL = 2e-2, 1e-2


@pytest.mark.parametrize("stage", STAGES)
def test_bf16_weights_over_fp32_masters_train_as_fp32_weights(launched, stage):
    runs = (*launched("pt"), "pt")
    got = np.array(_params(runs, 2, f"bf16w-{stage}"))
    assert np.array_equal(got, got.astype(np.float32).astype(np.float64))
    import torch
    assert torch.equal(torch.tensor(got).bfloat16().double(), torch.tensor(got))  # the model holds bf16
    assert_close(got, _params(runs, 2, "bf16-0"), rtol=BF16_RTOL, atol=BF16_ATOL,
                 site="parallel/zero::test_bf16_weights_over_fp32_masters_train_as_fp32_weights")
    assert [s["changed"] for s in runs[1][2, f"bf16w-{stage}"][0]["steps"][:4]] == [True] * 4


@pytest.mark.parametrize("stage", STAGES)
def test_bf16_weights_hold_2_bytes_a_parameter_and_the_masters_are_split_with_the_state(launched, stage):
    """Per rank: 2-byte weights; gradients 2 bytes (stages 0, 1: the bf16 .grad) or the fp32 shard
    (stage 2); the optimizer state LAMB's two buffers plus the fp32 masters, split at stages 1-2."""
    n, shard = 2, -(-244 // 2)
    for r in launched("pt")[1][n, f"bf16w-{stage}"]:
        m = r["memory"]
        assert m["parameters"] == 244 * 2
        assert m["gradients"] == (244 * 2 if stage < 2 else shard * 4)
        assert m["optimizer_state"] == (244 if stage == 0 else shard) * 4 * 3


def test_a_bf16_weight_checkpoint_holds_the_fp32_masters_and_resumes_in_either_precision(launched):
    """Stopped by SIGTERM after step 3 at stage 2 with bf16 weights (sharded): the checkpoint's
    weights are fp32 values bf16 cannot hold (the masters); resumed at stage 2 in bf16 weights it
    continues the uninterrupted run to round-off. At stage 1 (its gradients reduced into the bf16
    ``.grad``) and at stage 0 in fp32 weights (consolidated checkpoints from there on) it trains on
    within the bound of bf16 weights against fp32 ones."""
    from hvd_bert.pt.models.bert import read_checkpoint_weights

    root, results = launched("pt")
    assert results[2, "bf16w-stop-2"][0]["stopped"] and results[2, "bf16w-stop-2"][0]["steps"] == 3
    first = sorted((root / "from-bf16w-fp32").glob("ckpt-*"))[0]
    weights, _ = read_checkpoint_weights(first)
    flat = np.concatenate([w.ravel() for w in weights.values()]).astype(np.float32)
    import torch
    rounded = torch.from_numpy(flat).bfloat16().float().numpy()
    assert flat.dtype == np.float32 and (rounded != flat).mean() > 0.5
    runs = (root, results, "pt")
    for name in ("resume-bf16w-2", "resume-bf16w-1", "resume-fp32w-0"):
        assert results[2, name][0]["steps"] == 6 and not results[2, name][0]["stopped"], name
    assert_close(_params(runs, 2, "resume-bf16w-2"), _params(runs, 2, "bf16w-whole"), rtol=1e-5, atol=1e-6,
                 site="parallel/zero::test_a_bf16_weight_checkpoint_resumes/same-stage")
    for name in ("resume-bf16w-1", "resume-fp32w-0"):
        assert_close(_params(runs, 2, name), _params(runs, 2, "bf16w-whole"), rtol=BF16_RTOL, atol=BF16_ATOL,
                     site=f"parallel/zero::test_a_bf16_weight_checkpoint_resumes/{name}")
