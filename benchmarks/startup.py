"""Start-up of one rank: a 2-step ``hvd-bert pretrain`` of the tiny BERT, one process, each
framework, against the same job with the start-up work hvd_bert now avoids put back (the peer,
in the same run, alternating):

* PyTorch: ``torch.optim.Optimizer``'s first call imports TorchDynamo, which the jobs' backend
  skips (``hvd_bert.pt.backend._optimizers_without_dynamo``); the peer imports
  ``torch._dynamo`` first, so the skip does nothing and the job pays what it paid before.
* TensorFlow: the step and scorers are traced with ``autograph=False``; the peer wraps
  ``tf.function`` so that every trace runs AutoGraph again (``autograph=True``).

    .venv/bin/python benchmarks/startup.py [--reps 3] [--data DIR]

Wall time and CPU time (user + system, the process and its children) of the whole command.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

PEER = {
    "pt": "import torch._dynamo\n",
    "tf": ("import hvd_bert.tf, tensorflow as tf\n_f = tf.function\n"
           "def _with_autograph(*a, **k):\n    k['autograph'] = True\n    return _f(*a, **k)\n"
           "tf.function = _with_autograph\n"),
}
RUN = ("import runpy, sys\nsys.argv = ['hvd_bert'] + sys.argv[1:]\n"
       "runpy.run_module('hvd_bert', run_name='__main__')\n")


def once(framework: str, peer: bool, data: str, out: str) -> tuple[float, float]:
    code = (PEER[framework] if peer else "") + RUN
    argv = [sys.executable, "-c", code, "pretrain", "--framework", framework, "--set", f"data={data}",
            "--set", "max_seq_length=64", "--set", "max_predictions_per_seq=10", "--set", "progress=false",
            "--set", "train.batch.local_batch_size=8", "--set", "train.schedule.total_steps=2",
            "--set", f"train.output_dir={out}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True,
                         env=dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="3"))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        sys.exit(f"startup.py: the job failed:\n{res.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--data", help="prepared data at max_seq_length 64 (default: prepared here)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or os.path.join(tmp, "data")
        if not args.data:
            subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-bert", "--output", data,
                            "--max-seq-length", "64", "--max-predictions-per-seq", "10"],
                           check=True, capture_output=True)
        print("| framework | job | wall s (median) | CPU s (median) |\n|---|---|---:|---:|")
        for fw in ("pt", "tf"):
            got = {False: [], True: []}
            for i in range(args.reps):
                for peer in (True, False):
                    got[peer].append(once(fw, peer, data, os.path.join(tmp, f"run-{fw}-{peer}-{i}")))
            for peer, label in ((True, "peer: the work put back"), (False, "hvd_bert")):
                wall = statistics.median(w for w, _ in got[peer])
                cpu = statistics.median(c for _, c in got[peer])
                print(f"| {fw} | {label} | {wall:.2f} | {cpu:.2f} |", flush=True)


if __name__ == "__main__":
    main()
