"""train.report_to=mlflow is best-effort, through the command line: a tracker that cannot start
(a server that does not answer, a malformed MLFLOW_TRACKING_URI, a SQLite file that cannot be
created) refuses the run in one line with exit status 2 before it trains, within seconds, and
writes nothing; one that fails mid-run is named once and turned off, and the run finishes
with status 0 and its checkpoint. (The store a real MLflow client reads back: test_finetune.py.)"""

import json
import os
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from one_process import HVD_BERT, one_line, pretrain

pytest.importorskip("mlflow")

MLFLOW = ("--set", "train.report_to=[mlflow]")


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(folder.rglob("*"))}


def env_with(uri: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}  # (HTTP_BOUNDS apply)
    return dict(env, MLFLOW_TRACKING_URI=uri)


def refused(bert_data, run: Path, uri: str, *words):
    """A 4-step run on ``run`` (a finished 2-step run) with MLflow at ``uri``: one line holding
    ``words`` and ``uri``, exit status 2, the run folder as it was; the seconds it took."""
    before = tree(run)
    t0 = time.monotonic()
    res = pretrain(bert_data, run, *MLFLOW, steps=4, timeout=120, env=env_with(uri))
    took = time.monotonic() - t0
    line = one_line(res, *words)
    assert "Traceback" not in res.stdout and "train.report_to" in line, line
    assert tree(run) == before
    return line, took


@pytest.fixture
def closed_port():
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_tracking_server_that_refuses_connections_is_named_at_once(bert_data, finished_run, closed_port):
    uri = f"http://127.0.0.1:{closed_port}"
    line, took = refused(bert_data, finished_run, uri, f"the MLflow tracking server at {uri} does not answer",
                         "connection refused", "MLFLOW_TRACKING_URI")
    assert took < 60, (took, line)  # (the start of the process, then no wait at all)


def test_a_tracking_server_that_never_answers_is_named_within_seconds(bert_data, finished_run, silent_port):
    """MLflow's own defaults wait 120 s a request and retry 7 times (minutes of silence): the
    run bounds them (5 s, one retry) where the user set nothing."""
    uri = f"http://127.0.0.1:{silent_port}"
    line, took = refused(bert_data, finished_run, uri, f"the MLflow tracking server at {uri} does not answer",
                         "no answer within 5 s", "MLFLOW_HTTP_REQUEST_TIMEOUT")
    assert took < 75, (took, line)  # (the start of the process, and 2 x 5 s)


@pytest.mark.parametrize("uri", ["htp://127.0.0.1:5000", "127.0.0.1:5000", "http://[::1", "sqlite://",
                                 "sqlite:///:memory:"])
def test_a_malformed_tracking_uri_is_refused_in_one_line(uri, bert_data, finished_run):
    line, _ = refused(bert_data, finished_run, uri, "MLFLOW_TRACKING_URI")
    assert uri in line and "or leave mlflow out of train.report_to" in line, line


def test_a_refused_tracker_leaves_no_new_run_folder(bert_data, tmp_path):
    """A job whose run folder is new and whose tracker refuses to start leaves nothing behind."""
    run = tmp_path / "new-run"
    res = pretrain(bert_data, run, *MLFLOW, timeout=120, env=env_with("htp://127.0.0.1:5000"))
    one_line(res, "MLFLOW_TRACKING_URI")
    assert not run.exists()


def test_a_sqlite_store_that_cannot_be_created_is_refused_in_one_line(bert_data, finished_run, tmp_path):
    """Its folder is a file (as root, a folder's mode would not stop the write)."""
    (tmp_path / "a-file").write_text("not a folder\n")
    db = tmp_path / "a-file" / "mlflow.db"
    refused(bert_data, finished_run, f"sqlite:///{db}", f"SQLite store {db}", "writable folder")


def test_a_sqlite_store_on_a_read_only_file_system_is_refused_in_one_line(bert_data, finished_run,
                                                                             mount_point, tmp_path):
    (tmp_path / "src").mkdir()
    ro = mount_point("--bind", "-o", "ro", str(tmp_path / "src"), where="ro")
    db = ro / "mlflow.db"
    refused(bert_data, finished_run, f"sqlite:///{db}", f"SQLite store {db}", "writable folder")
    assert not db.exists()


def test_an_experiment_deleted_in_the_store_is_named_in_one_line(bert_data, finished_run, tmp_path):
    """MLflow keeps a deleted experiment's name taken (a run cannot start in it): the line says
    which experiment, and how to restore it or name another."""
    import mlflow

    db = tmp_path / "mlflow.db"
    client = mlflow.tracking.MlflowClient(f"sqlite:///{db}")
    client.delete_experiment(client.create_experiment("hvd_bert pretrain"))
    refused(bert_data, finished_run, f"sqlite:///{db}", "the experiment hvd_bert pretrain is deleted in the "
            "MLflow store", "mlflow experiments restore", "MLFLOW_EXPERIMENT_NAME")


def run_argv(bert_data, run: Path, steps: int = 4) -> list:
    return [*HVD_BERT, "pretrain", "--set", f"data={bert_data}", "--set", "max_seq_length=64",
            "--set", "max_predictions_per_seq=10", "--set", "train.log_every=1", "--set", "progress=false",
            "--set", "train.batch.local_batch_size=8", "--set", f"train.schedule.total_steps={steps}",
            "--set", f"train.output_dir={run}", *MLFLOW]


def test_a_store_that_breaks_mid_run_is_named_once_and_the_run_finishes(bert_data, tmp_path):
    """After the first steps' metrics the store's folder is moved away and a file put in its
    place (the database stays open, but SQLite cannot write its journal beside it any more):
    one line names the failure, tracking stops, the run finishes (status 0, its checkpoint)."""
    store, run = tmp_path / "store", tmp_path / "run"
    store.mkdir()
    proc = subprocess.Popen(run_argv(bert_data, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env_with(f"sqlite:///{store / 'mlflow.db'}"))
    try:
        metrics, deadline = run / "metrics.jsonl", time.monotonic() + 120
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):  # (step 1 is tracked)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGSTOP)  # (so that the store breaks while the run has steps to go)
        assert len(metrics.read_text().splitlines()) < 4
        store.rename(tmp_path / "store-moved")
        store.write_text("not a folder any more\n")
        os.kill(proc.pid, signal.SIGCONT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("hvd-bert pretrain: mlflow: logging train/") and "Traceback" not in stdout
    assert f"failed at sqlite:///{store / 'mlflow.db'}" in lines[0], lines[0]
    assert "tracking is off for the rest of this run" in lines[0], lines[0]
    assert "finished step 4" in stdout and (run / "ckpt-00000004.pt").is_file()
    assert len(metrics.read_text().splitlines()) == 4  # (every step, tracked or not)

    from mlflow.tracking import MlflowClient  # what the store holds: the steps before it broke

    client = MlflowClient(f"sqlite:///{tmp_path / 'store-moved' / 'mlflow.db'}")
    mlflow_run = client.get_run((run / "mlflow_run.txt").read_text().strip())
    logged = {m.step for m in client.get_metric_history(mlflow_run.info.run_id, "loss")}
    assert mlflow_run.info.status == "RUNNING" and 1 in logged and max(logged) < 4, logged


class GoesSilent(BaseHTTPRequestHandler):
    """Enough of MLflow's REST API for a run to start and log ``server.answers`` metrics; then
    it takes requests and never answers (a server that hangs mid-run)."""

    def log_message(self, *args):
        pass

    def reply(self, obj: dict, status: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # (no experiment or run of that name yet)
        self.reply({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "none"}, 404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/experiments/create"):
            return self.reply({"experiment_id": "1"})
        if self.path.endswith("/runs/create"):
            info = {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "RUNNING",
                    "lifecycle_stage": "active"}
            return self.reply({"run": {"info": info, "data": {}}})
        if self.path.endswith("/runs/log-metric"):
            self.server.metrics += 1
            if self.server.metrics > self.server.answers:
                self.server.released.wait(120)
                return
        self.reply({})


def test_a_server_that_hangs_mid_run_costs_seconds_and_the_run_finishes(bert_data, tmp_path):
    """The server answers the start and the first 10 metrics (of the first steps), then
    never again: one line after the bounded wait (5 s, one retry), the run finishes."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), GoesSilent)
    server.daemon_threads, server.metrics, server.answers, server.released = True, 0, 10, threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    run = tmp_path / "run"
    try:
        res = subprocess.run(run_argv(bert_data, run), capture_output=True, text=True, timeout=120,
                             env=env_with(uri))
    finally:
        server.released.set()
        server.shutdown()
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"failed at {uri} (no answer within 5 s)" in lines[0], lines
    assert "tracking is off for the rest of this run" in lines[0]
    assert server.metrics == 12  # (10 answered, then one request and its one retry)
    assert "finished step 4" in res.stdout and (run / "ckpt-00000004.pt").is_file()


def test_a_wandb_run_is_written_offline_and_continues_on_resume(bert_data, tmp_path):
    """train.report_to=[wandb]: an offline run in the run folder's wandb/, read back with wandb's
    own protobuf records: the settings as its config, every step's numbers under metrics.jsonl's
    names; a resumed job continues the same W&B run; nothing of wandb's own is printed."""
    pytest.importorskip("wandb")
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    import wandb_records

    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    res = pretrain(bert_data, run, "--set", "train.report_to=[wandb]", env=env)
    assert res.returncode == 0 and "wandb:" not in res.stdout + res.stderr, res.stdout[-2000:] + res.stderr
    res = pretrain(bert_data, run, "--set", "train.report_to=[wandb]", steps=3, env=env)
    assert res.returncode == 0 and "resumed from step 2" in res.stdout, res.stderr[-2000:]
    logs = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    run_id = (run / "wandb_run.txt").read_text().strip()
    assert logs and all(p.name == f"run-{run_id}.wandb" for p in logs), logs
    steps = {}
    for log in logs:
        about, config = wandb_records.run(log)
        assert about["project"] == "hvd_bert" and about["name"] == "run" and about["group"] == "pretrain"
        saved = json.loads((run / "config.json").read_text())
        assert config["train.optim.lr"] == saved["train"]["optim"]["lr"], config
        for h in wandb_records.history(log):
            steps[h["_step"]] = h
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted(steps) == [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        got = steps[m["step"]]
        assert got["loss"] == pytest.approx(m["loss"]) and got["lr"] == pytest.approx(m["lr"]), (got, m)
