"""Rank 0's run output: metrics.jsonl stays valid JSON and loses the steps a resume repeats;
progress lines instead of a redrawn bar where there is no terminal."""

import json

import pytest

from hvd_bert.train.log import RunLog, interactive, progress_line


def read(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_non_finite_values_are_written_as_null(tmp_path):
    log = RunLog(tmp_path, 0, total_steps=10, progress=False)
    log.record({"step": 1, "loss": float("nan"), "grad_norm": float("inf"), "lr": 0.1}, show=False)
    log.close()
    assert read(tmp_path) == [{"step": 1, "loss": None, "grad_norm": None, "lr": 0.1}]


def test_a_resume_drops_the_records_after_its_step(tmp_path):
    log = RunLog(tmp_path, 0, total_steps=10, progress=False)
    for s in (2, 4, 6, 8):
        log.record({"step": s, "loss": 1.0 / s}, show=False)
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 9, "lo')  # cut short by a crash
    log = RunLog(tmp_path, 0, total_steps=10, progress=False)
    log.set_step(4)  # the checkpoint the rerun resumed from
    log.record({"step": 6, "loss": 0.5}, show=False)
    log.close()
    assert [r["step"] for r in read(tmp_path)] == [2, 4, 6]
    assert read(tmp_path)[-1]["loss"] == 0.5


@pytest.mark.parametrize("step,total,done,secs,want", [
    (120, 200, 120, 52, "progress 120/200 (60%) | 2.31 steps/s | ETA 35s"),
    (0, 200, 0, 0, "progress 0/200 (0%) | 0.00 steps/s | ETA ?"),
    (10, 1000, 10, 100, "progress 10/1000 (1%) | 0.10 steps/s | ETA 2h45m"),
    (100, 220, 100, 100, "progress 100/220 (45%) | 1.00 steps/s | ETA 2m00s"),
])
def test_progress_line(step, total, done, secs, want):
    assert progress_line(step, total, done, secs) == want


def test_a_launcher_means_lines_not_a_bar(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    assert not interactive()


def test_progress_lines_are_printed_at_the_end(tmp_path, capsys):
    log = RunLog(tmp_path, 0, total_steps=3, progress=True)  # pytest's stderr is no terminal
    for _ in range(3):
        log.advance()
    log.close()
    out = capsys.readouterr().out
    assert "\r" not in out and "progress 3/3 (100%)" in out


class Writer:
    def __init__(self):
        self.scalars, self.closed = [], False

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        self.closed = True


def test_the_log_follows_rank_0_when_an_elastic_reset_renumbers_the_ranks(tmp_path):
    """Horovod elastic can make another process rank 0: it takes over metrics.jsonl and TensorBoard,
    the old rank 0 stops writing."""
    old, new = RunLog(tmp_path, 0, total_steps=10, progress=False), RunLog(tmp_path, 1, total_steps=10,
                                                                            progress=False)
    old.record({"step": 1, "loss": 1.0}, show=False)
    new.record({"step": 1, "loss": 1.0}, show=False)
    writers = []
    old.set_rank(1)
    new.set_rank(0, lambda: writers.append(Writer()) or writers[-1])
    new.set_step(1)
    for log in (old, new):
        log.record({"step": 2, "loss": 0.5}, show=False)
    assert read(tmp_path) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}]
    assert writers[0].scalars == [("train/loss", 0.5, 2)]
    new.set_rank(2)
    assert writers[0].closed
    new.record({"step": 3, "loss": 0.25}, show=False)
    assert [r["step"] for r in read(tmp_path)] == [1, 2]


def test_tensorboard_gets_every_number_once_under_one_level_of_tags(tmp_path):
    """The same scalars from both frameworks (ScalarWriter): loss, lr and grad_norm of training,
    ``eval/accuracy`` (not ``eval/eval_accuracy``); not the step, the clock or a flag; and no
    TensorFlow in the process that writes them (a fresh interpreter)."""
    import json
    import subprocess
    import sys

    code = f"""
import json, sys
from hvd_bert.train.log import RunLog, ScalarWriter
tb = ScalarWriter({str(tmp_path / "tb")!r})
log = RunLog({str(tmp_path)!r}, 0, total_steps=2, progress=False, writer=tb)
log.record({{"step": 1, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.7, "time": 1.0, "skipped": False}},
           show=False)
log.record({{"step": 2, "eval_accuracy": 0.75, "eval_examples": 40}}, prefix="eval", show=False)
log.close()
print(json.dumps("tensorflow" in sys.modules))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) is False
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    (events,) = list((tmp_path / "tb").iterdir())
    scalars = [(v.tag, round(v.simple_value, 6), e.step) for raw in RawEventFileLoader(str(events)).Load()
               for e in [Event.FromString(raw)] for v in e.summary.value]
    assert sorted(scalars) == [("eval/accuracy", 0.75, 2), ("eval/examples", 40.0, 2),
                               ("train/grad_norm", 0.7, 1), ("train/loss", 2.5, 1), ("train/lr", 0.001, 1)]


def test_a_tensorboard_folder_replaced_mid_run_is_one_line_and_training_goes_on(tmp_path):
    """The events are written in the caller's thread, the file opened for each write: a folder
    deleted and replaced by a file mid-run is one line from the tracker guard (no background
    thread's traceback, no writes lost into a deleted file), and the run goes on."""
    import subprocess
    import sys

    tb = tmp_path / "tb"
    code = f"""
import pathlib, shutil
from hvd_bert.train.log import ScalarWriter
from hvd_bert.train.trackers import Writers
tb = pathlib.Path({str(tb)!r})
w = Writers({{"tensorboard": ScalarWriter(tb)}})
w.add_scalar("train/loss", 1.0, 1)
shutil.rmtree(tb)
tb.write_text("not a folder")
for step in (2, 3):
    w.add_scalar("train/loss", 0.5, step)
w.close()
print("went on")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "went on", res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "tensorboard: logging train/loss at step 2 failed" in lines[0], res.stderr
    assert tb.read_text() == "not a folder"
