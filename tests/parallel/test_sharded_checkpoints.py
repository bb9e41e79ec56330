"""Sharded checkpoints (``train.checkpoint_format=sharded``; hvd_bert/pt/sharded.py) under real
``horovodrun``: a small BERT saved on 4 ranks in four layouts (tensor parallelism 2 x ZeRO-2 and
x ZeRO-0, ZeRO-1 and ZeRO-0 over 4 replicas) resumes on 3, 2 and 1 ranks under other ZeRO stages and
tensor-parallel degrees and ends where the uninterrupted run ends, to fp32 round-off; every
rank writes about 1/N of the state; a run killed (SIGKILL) while its background save is being
written resumes from the checkpoint before; a damaged checkpoint is refused on every rank with
the same line.

Each step's global batch (12 sequences) is the same whatever the layout, so every resumed run is
the same trajectory. Four launches: 4 ranks (the reference run and both saves), 3, 2, 1."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from closeness import assert_close  # noqa: E402
from conftest import launch_ranks  # noqa: E402

STEPS = 6
# (name, ranks, tensor_parallel, ZeRO stage, where it resumes from)
RESUMES = [("tp2z2-on-3-z2", 3, 1, 2, "tp2z2"), ("tp2z2-on-2-z0", 2, 1, 0, "tp2z2"),
           ("tp2z2-on-1", 1, 1, 0, "tp2z2"), ("z1-on-2-tp2z1", 2, 2, 1, "z1"), ("z1-on-3-z0", 3, 1, 0, "z1"),
           ("z1-on-1", 1, 1, 0, "z1"), ("killed-on-2-tp2", 2, 2, 2, "killed"),
           ("tp2z0-on-1", 1, 1, 0, "tp2z0"), ("z0-on-3-z2", 3, 1, 2, "z0")]


def reshard(tp, stage, folder, steps=STEPS, save_at=(), kill_at=0, fmt="sharded"):
    return ["reshard", tp, stage, steps, str(folder), fmt, list(save_at), kill_at]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    results = {}

    def launch(np_, scenarios, tag, expect_ok=True):
        spec = root / f"{tag}.json"
        spec.write_text(json.dumps(scenarios))
        got = launch_ranks("tensor_parallel.py", ["batch", spec], root / f"out-{tag}", np=np_, timeout=400,
                           expect_ok=expect_ok)
        if expect_ok:
            for name in scenarios:
                results[name] = [r[name] for r in got]
        return got

    launch(4, {"reference": reshard(1, 0, root / "reference", fmt="consolidated"),
               "tp2z2": reshard(2, 2, root / "tp2z2", steps=3, save_at=[3]),
               "z1": reshard(1, 1, root / "z1", steps=3, save_at=[3]),
               "tp2z0": reshard(2, 0, root / "tp2z0", steps=3, save_at=[3]),
               "z0": reshard(1, 0, root / "z0", steps=3, save_at=[3])}, "save")
    # saved at step 3 (complete), then killed as the step-4 save is being written
    killed = launch(4, {"killed": reshard(2, 2, root / "killed", steps=4, save_at=[3, 4], kill_at=4)},
                    "killed", expect_ok=False)
    for np_ in (3, 2, 1):
        runs = {}
        for name, n, tp, stage, source in RESUMES:
            if n == np_:
                shutil.copytree(root / source, root / name)
                runs[name] = reshard(tp, stage, root / name)
        launch(np_, runs, f"on-{np_}")
    return root, results, killed


def _weights(results, name):
    ranks = results[name]
    return {k: np.array(v) for k, v in ranks[0]["weights"].items()}


@pytest.mark.parametrize("name", [r[0] for r in RESUMES])
def test_a_checkpoint_resumes_under_another_layout_on_the_same_trajectory(launched, name):
    _, results, _ = launched
    assert [r["resumed_at"] for r in results[name]] == [3] * len(results[name])
    want, got = _weights(results, "reference"), _weights(results, name)
    assert got.keys() == want.keys()
    for k in want:
        assert_close(got[k], want[k], rtol=1e-5, atol=1e-6,
                     site="parallel/sharded::test_a_checkpoint_resumes_under_another_layout", err_msg=k)


def test_every_rank_writes_its_share_and_the_index_comes_last(launched):
    """4 ranks under TP 2 x ZeRO-2: each rank's file holds about 1/4 of the model and its LAMB
    state (the tensors whole on a tensor-parallel group written by its first rank only)."""
    root = launched[0]
    (folder,) = sorted((root / "tp2z2").glob("ckpt-*.shards"))
    index = json.loads((folder / "index.json").read_text())
    sizes = {f: sum(e["flat"][1] - e["flat"][0] for e in info["pieces"].values())
             for f, info in index["files"].items()}
    total = sum(sizes.values())
    params = sum(len(v) for v in _weights(launched[1], "reference").values())
    assert total == 3 * params  # the weights, exp_avg and exp_avg_sq, each written once
    assert sorted(sizes) == [f"rank-0000{r}.safetensors" for r in range(4)]
    assert max(sizes.values()) < 0.4 * total, sizes


def test_a_run_killed_during_its_background_save_resumes_from_the_one_before(launched):
    root, results, killed = launched
    assert not killed.ok
    complete = sorted(p.name for p in (root / "killed").glob("ckpt-*.shards") if (p / "index.json").is_file())
    # the step-4 save had begun (its folder is there) and was cut before its index: incomplete
    assert complete == ["ckpt-00000003.shards"] and (root / "killed" / "ckpt-00000004.shards").is_dir()
    # its copy resumed from step 3 (and dropped the incomplete folder)
    assert results["killed-on-2-tp2"][0]["resumed_at"] == 3
    assert not (root / "killed-on-2-tp2" / "ckpt-00000004.shards").exists() or \
        (root / "killed-on-2-tp2" / "ckpt-00000004.shards" / "index.json").is_file()


@pytest.fixture(scope="module")
def sharded_run(bert_data, tmp_path_factory):
    """A 2-step one-process pretraining job with train.checkpoint_format=sharded: (folder, stdout)."""
    from one_process import pretrain

    run = tmp_path_factory.mktemp("sharded-job") / "run"
    res = pretrain(bert_data, run, "--set", "train.checkpoint_format=sharded")
    assert res.returncode == 0, res.stderr[-3000:]
    return run, res.stdout


def test_a_job_writes_a_complete_sharded_checkpoint_and_says_its_memory(sharded_run):
    run, out = sharded_run
    assert [p.name for p in run.glob("ckpt-*")] == ["ckpt-00000002.shards"]
    assert (run / "ckpt-00000002.shards" / "index.json").is_file()
    assert "memory plan per rank: weights" in out and "activation_checkpointing off) = " in out
    assert "; 1 rank on host" in out
    assert "peak memory of rank 0:" in out and "reached by" in out


def _truncate(folder):
    shard = folder / "rank-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])


def _name_a_missing_file(folder):
    index = json.loads((folder / "index.json").read_text())
    index["files"]["rank-00009.safetensors"] = {"bytes": 10, "pieces": {}}
    (folder / "index.json").write_text(json.dumps(index))


# (a deleted shard file is refused as an index naming a missing one: tests/core/test_sharded_checkpoint.py)
@pytest.mark.parametrize("damage,words", [(_truncate, ("rank-00000.safetensors is truncated",)),
                                          (_name_a_missing_file, ("rank-00009.safetensors", "missing"))])
def test_a_damaged_sharded_checkpoint_is_refused_in_one_line(bert_data, sharded_run, tmp_path, damage, words):
    from one_process import one_line, pretrain

    run = tmp_path / "run"
    shutil.copytree(sharded_run[0], run)
    folder = run / "ckpt-00000002.shards"
    damage(folder)
    before = sorted((p.name, p.stat().st_size) for p in folder.iterdir())
    res = pretrain(bert_data, run, "--set", "train.checkpoint_format=sharded", steps=3)
    one_line(res, *words, "delete the folder")
    assert sorted((p.name, p.stat().st_size) for p in folder.iterdir()) == before  # (nothing pruned or lost)


def test_a_full_disk_during_a_background_save_is_named_and_the_older_checkpoint_resumes(bert_data,
                                                                                       mount_point):
    """The shard's write fails in the writer thread; the run stops at its end with the disk named
    in one line (exit 2); the step-2 checkpoint stays complete; with room again it resumes and
    the incomplete step-4 folder is removed."""
    from one_process import one_line, pretrain

    disk = mount_point("-t", "tmpfs", "-o", "size=48m", "tmpfs")
    run = disk / "run"
    sharded = ("--set", "train.checkpoint_format=sharded")
    assert pretrain(bert_data, run, *sharded).returncode == 0
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * (free - 64 * 1024))  # 64 KiB left: no room for a shard
    res = pretrain(bert_data, run, *sharded, steps=4)
    one_line(res, f"no space left on {disk} while writing {run / 'ckpt-00000004.shards'}",
             "the checkpoints already there are intact")
    assert (run / "ckpt-00000002.shards" / "index.json").is_file()
    assert not (run / "ckpt-00000004.shards" / "index.json").exists()
    (disk / "filler").unlink()
    res = pretrain(bert_data, run, *sharded, steps=4)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-3000:]
    assert sorted(p.name for p in run.glob("ckpt-*")) == ["ckpt-00000002.shards", "ckpt-00000004.shards"]
