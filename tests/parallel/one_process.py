"""One-process runs of the toolkit's commands for the adversarial tests: ``hvd(...)`` runs
``python -m hvd_bert ...``, ``pretrain`` a 2-step tiny pretraining run, ``one_line`` checks a
refusal (its exit status, one line on stderr, no traceback)."""

import subprocess
import sys

HVD_BERT = [sys.executable, "-m", "hvd_bert"]


def hvd(*args, timeout=240, env=None, cwd=None):
    return subprocess.run([*HVD_BERT, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd)


def pretrain(bert_data, out, *extra, steps=2, timeout=240, env=None):
    return hvd("pretrain", "--set", f"data={bert_data}", "--set", "max_seq_length=64",
               "--set", "max_predictions_per_seq=10", "--set", "train.log_every=1", "--set", "progress=false",
               "--set", "train.batch.local_batch_size=8", "--set", f"train.schedule.total_steps={steps}",
               "--set", f"train.output_dir={out}", *extra, timeout=timeout, env=env)


def one_line(res, *words, status=2):
    """The exit status, one line on stderr holding ``words``, no traceback."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == status and len(lines) == 1, res.stdout[-2000:] + res.stderr[-3000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]
