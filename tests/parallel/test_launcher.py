"""``python -m hvd_bert.cluster.horovodrun``, the Gloo launch of ``hvd_bert.cluster.launch``: Horovod's own
launcher with its build check answered from a cached file instead of a TensorFlow import. Its
answers must be Horovod's own (``horovod.common.util``), computed once per install, and a
PyTorch job launched through it must not start TensorFlow anywhere (launcher included)."""

import json
import os
import subprocess
import sys

import pytest

from hvd_bert.cluster import launch

TF_NOISE = ("oneDNN custom operations", "Could not find cuda drivers", "absl::InitializeLog")


def answers(code, cache):
    res = subprocess.run([sys.executable, "-c", f"import json; {code}"], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, HVD_BERT_CACHE=str(cache)))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


OURS = "from hvd_bert.cluster.horovodrun import built; print(json.dumps(built()))"
HOROVODS = ("from horovod.common.util import gloo_built, mpi_built; "
            "print(json.dumps({'gloo_built': gloo_built(), 'mpi_built': mpi_built()}))")


def test_the_cached_build_check_is_horovods_own_answer(tmp_path):
    cache = tmp_path / "cache"
    ours = answers(OURS, cache)
    assert ours == answers(HOROVODS, cache) == {"gloo_built": True, "mpi_built": True}
    files = list((cache / "horovod").glob("built-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == ours
    files[0].write_text("{not json")  # a damaged cache file is asked again and rewritten
    assert answers(OURS, cache) == ours and json.loads(files[0].read_text()) == ours


def test_a_pytorch_gloo_launch_starts_no_tensorflow(tmp_path):
    res = launch.run(["-c", "import horovod.torch as hvd; hvd.init(); print('rank', hvd.rank())"], np=2,
                     timeout=120)
    assert res.ok, res.explain()
    assert "rank 0" in res.stdout and "rank 1" in res.stdout
    out = res.stdout + res.stderr
    assert not any(n in out for n in TF_NOISE), out[-3000:]
    assert "hvd_bert.cluster.horovodrun" in " ".join(res.command)


@pytest.mark.parametrize("form", ["launch --mpi", "flags --gloo"])
def test_hvd_bert_launch_keeps_the_jobs_exit_status_and_says_a_user_error_once(form, tmp_path):
    """``hvd-bert launch -np 2 -- pretrain ...`` and ``hvd-bert pretrain -np 2 ...``: a user
    error on every rank is its one line (and hint) once, on stderr, with the job's status 2 and
    none of the launcher's traceback or banners."""
    how, launcher = form.split()
    job = ["pretrain", "--set", f"data={tmp_path / 'nowhere'}"]
    argv = ["launch", "-np", "2", launcher, "--", *job] if how == "launch" else [*job, "-np", "2", launcher]
    res = subprocess.run([sys.executable, "-m", "hvd_bert", *argv], capture_output=True, text=True,
                         timeout=300, env=launch.mpi_env(os.environ), cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("hvd-bert pretrain: data folder") == 1, res.stderr
    assert res.stderr.count("to prepare the built-in corpus") == 1, res.stderr
    for noise in ("Traceback", "Horovod detected", "Primary job", "Process name", "<stderr>", *TF_NOISE):
        assert noise not in res.stdout + res.stderr, noise


def test_hvd_bert_launch_passes_the_ranks_output_through_with_one_prefix(bert_data, tmp_path):
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "launch", "-np", "2", "--", "pretrain",
                          "--set", f"data={bert_data}", "--set", "max_seq_length=64",
                          "--set", "max_predictions_per_seq=10", "--set", "train.schedule.total_steps=2",
                          "--set", "train.log_every=1", "--set", f"train.output_dir={out}",
                          "--set", "progress=false", "--set", "train.batch.local_batch_size=8"],
                         capture_output=True, text=True, timeout=300, env=launch.mpi_env(os.environ))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines and all(line.startswith(("[0] ", "[1] ")) for line in lines), lines
    assert "[0] world: 2 ranks on 1 host" in res.stdout and "[0] finished step 2;" in res.stdout
    assert "<stdout>" not in res.stdout and not any(n in res.stdout + res.stderr for n in TF_NOISE)


@pytest.mark.parametrize("launcher", ["--mpi", "--gloo"])
def test_a_signal_to_hvd_bert_launch_saves_stops_with_status_3_and_the_rerun_resumes(launcher, bert_data,
                                                                                    tmp_path):
    """(--mpi: Ctrl-C, SIGINT to the launcher's process group as a terminal sends it; --gloo:
    SIGTERM twice, 5 ms apart.)"""
    """SIGTERM to ``hvd-bert launch`` (what SLURM, a scheduler or ``kill`` sends): the ranks on
    this machine get it, as srun and torchrun deliver it, so each saves a checkpoint and the
    job stops together (a second signal too); the launcher's status is the job's 3, and the same
    command resumes. (horovodrun alone answers a second SIGTERM by killing the ranks: 143/137.)"""
    import signal
    import time

    out = tmp_path / "run"
    argv = [sys.executable, "-m", "hvd_bert", "launch", "-np", "2", launcher, "--", "pretrain",
            "--set", f"data={bert_data}", "--set", "max_seq_length=64", "--set", "max_predictions_per_seq=10",
            "--set", "train.schedule.total_steps=100000", "--set", "train.log_every=1",
            "--set", f"train.output_dir={out}", "--set", "progress=false",
            "--set", "train.batch.local_batch_size=8"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=launch.mpi_env(os.environ), start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        metrics = out / "metrics.jsonl"
        while not metrics.is_file() or len(metrics.read_text().splitlines()) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        if launcher == "--mpi":
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        else:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.005)
            proc.send_signal(signal.SIGTERM)  # twice, 5 ms apart (a scheduler's, then an impatient
            # user's): the second lands while the launcher still handles the first (which once hung it)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 3, stdout[-3000:] + stderr[-3000:]
    stopped = int(stdout.split("stopped by a signal at step ")[1].split(";")[0])
    assert (out / f"ckpt-{stopped:08d}.shards" / "index.json").is_file() and "(exit status 3)" in stdout
    for noise in ("Traceback", "KeyboardInterrupt", "Primary job", "Process name", "<stderr>"):
        assert noise not in stdout + stderr, noise
    again = subprocess.run([*argv[:argv.index("train.schedule.total_steps=100000")],
                            f"train.schedule.total_steps={stopped + 2}", *argv[argv.index(
                                "train.schedule.total_steps=100000") + 1:]],
                           capture_output=True, text=True, timeout=300, env=launch.mpi_env(os.environ))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"resumed from step {stopped}" in again.stdout and f"finished step {stopped + 2};" in again.stdout
