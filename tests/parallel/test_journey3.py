"""The user's journey, round 3, through the command line: a restart's TensorBoard shows no stale
points, small SQuAD data makes no empty shard and trains, the lines that misled say what to do."""

import json
import os
import subprocess
import sys
from pathlib import Path

from hvd_bert.cluster import launch

HVD_BERT = [sys.executable, "-m", "hvd_bert"]
VOCAB = Path(__file__).parents[1] / "data" / "stdlib-uncased-1500-vocab.txt"


def hvd(*args, timeout=300):
    return subprocess.run([*HVD_BERT, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=launch.mpi_env(os.environ))


def pretrain(bert_data, out, *extra):
    return hvd("pretrain", "--set", f"data={bert_data}", "--set", "max_seq_length=64",
               "--set", "max_predictions_per_seq=10", "--set", "train.log_every=1", "--set", "progress=false",
               "--set", "train.batch.local_batch_size=8", "--set", f"train.output_dir={out}", *extra)


def test_a_restart_from_scratch_leaves_no_stale_points_in_tensorboard(bert_data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert pretrain(bert_data, out, "--set", "train.schedule.total_steps=5").returncode == 0
    for ckpt in out.glob("ckpt-*"):
        ckpt.unlink()  # a start from scratch in the same folder (other seed: other losses)
    res = pretrain(bert_data, out, "--set", "train.schedule.total_steps=3", "--set", "train.seed=7")
    assert res.returncode == 0, res.stderr[-2000:]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    shown = [(e.step, e.value) for e in events.Scalars("train/loss")]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    logged = [(m["step"], m["loss"]) for m in map(json.loads, lines)]
    assert [s for s, _ in shown] == [1, 2, 3] and [s for s, _ in logged] == [1, 2, 3]  # the new run's only
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(shown, logged))


def squad(n_questions: int) -> dict:
    context = "The note was written by Ada Lovelace in 1843 about the engine of Charles Babbage."
    qas = [{"id": str(i), "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
           for i, (q, a) in enumerate([("Who wrote the note?", "Ada Lovelace"), ("When?", "1843"),
                                       ("Whose engine?", "Charles Babbage")][:n_questions])]
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}


def test_small_squad_data_makes_no_empty_shard_and_a_rank_without_a_batch_is_named_up_front(tmp_path):
    (tmp_path / "train.json").write_text(json.dumps(squad(3)))
    res = hvd("prepare-squad", "--input", tmp_path / "train.json", "--output", tmp_path / "sq",
              "--vocab", VOCAB, "--max-seq-length", "64", "--doc-stride", "32", "--max-query-length", "16")
    assert res.returncode == 0, res.stderr
    side = json.loads((tmp_path / "sq" / "dataset.json").read_text())
    assert side["num_shards"] == 3 and all(s["records"] > 0 for s in side["shards"]), side["shards"]
    res = hvd("finetune", "-np", "2", "--set", f"data={tmp_path / 'sq'}", "--set", "epochs=2",
              "--set", "train.batch.local_batch_size=2", "--set", f"train.output_dir={tmp_path / 'ft'}",
              "--set", "model=tiny")
    lines = [ln for ln in res.stderr.splitlines() if "warning" not in ln]
    assert res.returncode == 2 and len(lines) == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "fewer than one local batch of 2" in lines[0]
    assert "smaller train.batch.local_batch_size" in lines[0]
    assert not (tmp_path / "ft").exists()  # found before the run folder was touched


def test_the_lines_that_misled_say_what_to_do(bert_data, tmp_path):
    out = tmp_path / "run"
    assert pretrain(bert_data, out, "--set", "train.schedule.total_steps=2").returncode == 0
    (out / "task.json").write_text(json.dumps({"task": "classification", "labels": ["no", "yes"]}))
    table = tmp_path / "t.tsv"
    table.write_text("sentence\ngood\n")
    res = hvd("predict", out, table, "--framework", "tf")
    assert res.returncode == 2 and "drop --framework tf" in res.stderr, res.stderr
    (tmp_path / "folder").mkdir()
    res = hvd("predict", out, tmp_path / "folder")
    assert res.returncode == 2, res.stderr
    assert "a folder without prepared data (no dataset.json)" in res.stderr, res.stderr
    res = pretrain(bert_data, tmp_path / "tp", "-np", "2", "--set", "train.tensor_parallel=2",
                   "--set", "train.schedule.total_steps=1")
    assert res.returncode == 0, res.stderr[-2000:]
    import re

    model = next(ln for ln in res.stdout.splitlines() if "model: BERT-tiny" in ln)
    got = re.search(r"\(([0-9.]+)M parameters, ([0-9.]+)M on each of its 2 tensor-parallel ranks", model)
    assert got and float(got.group(2)) < float(got.group(1)), model  # the whole model, then a rank's share
    assert "1/2 of the global batch of the same command without train.tensor_parallel" in res.stdout
