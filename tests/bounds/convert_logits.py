"""Measures the bound of tests/parallel/test_bert_convert.py: the largest difference between
PyTorch's and TensorFlow's MLM/NSP logits for the same weights, over several batches (seeds) and
both directions of conversion. Not collected by pytest (no test_ prefix); run it on each CPU kind:

    .venv/bin/python tests/bounds/convert_logits.py [--seeds 8]
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

WORKER = Path(__file__).resolve().parents[1] / "parallel" / "workers" / "bert_logits.py"


def batch(path: Path, seed: int) -> None:  # the test's batch layout, another seed
    rng = np.random.default_rng(seed)
    b, s, p = 4, 24, 5
    mask = np.ones((b, s), np.int32)
    mask[1, 15:] = 0
    mask[3, 9:] = 0
    np.savez(path, input_ids=rng.integers(0, 1003, (b, s)).astype(np.int32) * mask,
             segment_ids=(np.arange(s) >= 12).astype(np.int32)[None].repeat(b, 0) * mask,
             input_mask=mask, masked_lm_positions=rng.integers(1, 9, (b, p)).astype(np.int32))


def logits(framework, b, out, *extra):
    subprocess.run([sys.executable, str(WORKER), framework, str(b), str(out), *extra], check=True,
                   capture_output=True)
    return dict(np.load(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for seed in range(args.seeds):
            b = d / f"batch{seed}.npz"
            batch(b, seed)
            pt = logits("pt", b, d / "pt.npz", "--export", str(d / "ptw.npz"))
            tf_ = logits("tf", b, d / "tf.npz", "--init", str(d / "ptw.npz"), "--export", str(d / "tfw.npz"))
            back = logits("pt", b, d / "back.npz", "--init", str(d / "tfw.npz"))
            tf_own = logits("tf", b, d / "tfo.npz", "--export", str(d / "tfow.npz"))
            pt_of_tf = logits("pt", b, d / "pto.npz", "--init", str(d / "tfow.npz"))
            for name, x, y in (("pt->tf", tf_, pt), ("tf->pt", pt_of_tf, tf_own), ("round trip", back, pt)):
                for k in ("mlm", "nsp"):
                    diff = np.abs(x[k] - y[k])
                    rel = diff / np.maximum(np.abs(y[k]), 1e-12)
                    rows.append((seed, name, k, float(diff.max()), float(np.median(rel))))
                    print(f"seed {seed} {name:10s} {k}: max abs diff {diff.max():.2e}", flush=True)
    worst = max(r[3] for r in rows)
    print(f"largest |pt - tf| over {args.seeds} batches and both directions: {worst:.2e}")


if __name__ == "__main__":
    main()
