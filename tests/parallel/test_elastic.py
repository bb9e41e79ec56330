"""Horovod elastic across three fake nodes: `hvd-bert pretrain` under `horovodrun --min-np 2
--max-np 3 --host-discovery-script`, rank 0's worker killed with -9 mid-run, its host left out
of the discovery script's answer and later given back. The run must reach the configured step
count with every step logged once, the configured global batch (k recomputed: 2 on 3 ranks, 3
on 2) and the configured LR schedule at every step, a loss curve that goes on where it was, and
an optimizer whose own step counter says every step was applied once."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bert_jobs import TINY, metrics_of
from conftest import fake_cluster, on_node1
from hvd_bert import launch
from hvd_bert.common.config import PretrainConfig, make_schedule

pytestmark = pytest.mark.multinode

GLOBAL, LOCAL, TOTAL = 48, 8, 30
LAYOUT = re.compile(r"elastic: (\d+) ranks: global batch (\d+) = local batch (\d+) x "
                    r"backward_passes_per_step (\d+)")
PLACEMENT = re.compile(r"world: \d+ ranks on \d+ hosts: (.*)")


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    yield from fake_cluster(tmp_path_factory, 3, "hvde", "10.213.10")


def workers_on(host: str) -> list[int]:
    """The pids of the pretrain workers Horovod started on ``host`` (the nodes share one process
    table; each worker's environment names its host)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pretrain" in argv and f"HOROVOD_HOSTNAME={host}".encode() in env:
            pids.append(int(p.name))
    return pids


def logged_steps(out: Path) -> list[int]:
    try:
        return [m["step"] for m in metrics_of(out)]
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def wait_for(cond, timeout, what, proc, log):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        if proc.poll() is not None:
            pytest.fail(f"the job ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-6000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {what} after {timeout} s:\n{log.read_text()[-6000:]}")


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_a_killed_worker_and_its_return_keep_the_global_batch_and_the_schedule(cluster3, bert_data, tmp_path,
                                                                               framework):
    hosts = tmp_path / "hosts"
    hosts.write_text("node1:1\nnode2:1\nnode3:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    out, log = tmp_path / "run", tmp_path / "job.log"
    venv_bin = str(Path(sys.executable).parent)
    cmd = [*on_node1(cluster3), "env", f"PATH={venv_bin}:{os.environ['PATH']}",
           "HOROVOD_GLOO_TIMEOUT_SECONDS=20", launch.tool_path("horovodrun"),
           "-np", "3", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", str(discover), "--network-interface", "eth0",
           "--blacklist-cooldown-range", "1", "2",
           sys.executable, "-m", "hvd_bert", "pretrain", "--framework", framework,
           "--set", f"data={bert_data}", *TINY, "--set", f"train.batch.global_batch_size={GLOBAL}", "--set",
           "train.batch.backward_passes_per_step=null", "--set", f"train.schedule.total_steps={TOTAL}",
           "--set", "train.log_every=1", "--set", "train.checkpoint_every=10",
           "--set", f"train.output_dir={out}"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    try:
        wait_for(lambda: len(logged_steps(out)) >= 6, 400, "6 logged steps", proc, log)
        rank0 = PLACEMENT.search(log.read_text()).group(1).split(",")[0].split()[0]  # "node3 rank 0" -> node3
        pids = workers_on(rank0)
        assert len(pids) == 1, (rank0, pids)
        os.kill(pids[0], signal.SIGKILL)  # rank 0: its log and its broadcasts must move to another rank
        killed_at, t_kill = logged_steps(out)[-1], time.time()
        hosts.write_text("".join(f"{h}:1\n" for h in ("node1", "node2", "node3") if h != rank0))
        wait_for(lambda: len(LAYOUT.findall(log.read_text())) >= 2, 120, "layout for 2 ranks", proc, log)
        recovered_s = time.time() - t_kill
        wait_for(lambda: logged_steps(out) and logged_steps(out)[-1] >= killed_at + 6, 300,
                 "6 steps on 2 ranks", proc, log)
        hosts.write_text("node1:1\nnode2:1\nnode3:1\n")  # the host is back
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    print(f"{framework}: rank 0 on {rank0} killed after step {killed_at}; the 2-rank layout was up "
          f"{recovered_s:.1f} s later")
    assert proc.returncode == 0, text[-6000:]
    assert f"finished step {TOTAL}" in text, text[-6000:]
    # every step once, none lost
    assert logged_steps(out) == list(range(1, TOTAL + 1)), text[-6000:]
    # the configured global batch on every world; k recomputed from the world size
    layouts = [tuple(map(int, m)) for m in LAYOUT.findall(text)]
    assert layouts == [(3, GLOBAL, LOCAL, 2), (2, GLOBAL, LOCAL, 3), (3, GLOBAL, LOCAL, 2)], layouts
    assert rank0 in PLACEMENT.findall(text)[-1]  # the host came back
    # the configured LR schedule at every step, peak LR of the configured global batch
    cfg = PretrainConfig().train
    schedule = make_schedule(replace(cfg.schedule, total_steps=TOTAL),
                             replace(cfg.optim, lr=1e-2).peak_lr(GLOBAL))
    records = metrics_of(out)
    for r in records:
        assert r["lr"] == pytest.approx(schedule(r["step"]), rel=1e-5, abs=1e-9), r
    # the loss curve goes on where it was (a restart from scratch would jump back to ~8)
    losses = [r["loss"] for r in records]
    assert max(abs(b - a) for a, b in zip(losses, losses[1:])) < 0.3, losses
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses
    # the optimizer's own step counter: every step applied once
    assert optimizer_steps(framework, out / f"ckpt-{TOTAL:08d}.{framework}") == TOTAL
    assert not any(workers_on(h) for h in ("node1", "node2", "node3"))


def optimizer_steps(framework: str, ckpt: Path) -> int:
    code = {"pt": "import torch,sys; s=torch.load(sys.argv[1], weights_only=True)['optimizer']['state'];"
                  "print(sorted({int(v['step']) for v in s.values()}))",
            "tf": "import sys,tensorflow as tf; r=tf.train.load_checkpoint(sys.argv[1] + '/ckpt');"
                  "print([int(r.get_tensor(k)) for k in r.get_variable_to_shape_map() if k.startswith("
                  "'optimizer/_iterations')])"}[framework]
    res = subprocess.run([sys.executable, "-c", code, str(ckpt)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3"))
    assert res.returncode == 0, res.stderr
    counts = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(counts) == 1, counts
    return counts[0]
