"""Load time of a BERT-Base-sized checkpoint in each published format: hvd_bert's readers (into
its PyTorch model, or its TensorFlow one) against ``transformers.BertForPreTraining.
from_pretrained`` of the same Hugging Face folder, each load in a fresh process, alternating,
in the same run.

    .venv/bin/python benchmarks/checkpoint_load.py [--repeats 3] [--model base]

Writes the table to stdout and ``benchmarks/results/checkpoint_load.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRESETS = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
           "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=2048)}


def make(root: Path, model: str) -> dict[str, Path]:
    """A random transformers BERT saved as safetensors and .bin, and the same weights as a
    Google TF1 checkpoint and a portable .npz (written by hvd_bert)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_act="gelu_new", **PRESETS[model])  # Google: tanh
    m = transformers.BertForPreTraining(cfg)
    m.save_pretrained(root / "hf")
    (root / "hf-bin").mkdir()
    cfg.save_pretrained(root / "hf-bin")
    torch.save(m.state_dict(), root / "hf-bin" / "pytorch_model.bin")
    for to, out in (("google", "google"), ("npz", "w.npz")):
        subprocess.run([sys.executable, "-m", "hvd_bert", "convert", str(root / "hf"), "--to", to, "--output",
                        str(root / out)], check=True, capture_output=True)
    return {"hf safetensors": root / "hf", "hf pytorch_model.bin": root / "hf-bin",
            "google TF1": root / "google", "portable .npz": root / "w.npz"}


LOADERS = {
    "hvd_bert pt": """
import time, sys
t = time.perf_counter()
from hvd_bert.pt.models.bert import BertForPreTraining, load_weights, read_checkpoint_weights
arrays, config = read_checkpoint_weights(sys.argv[1])
load_weights(BertForPreTraining(config), arrays, source="bench")
print(time.perf_counter() - t)""",
    "hvd_bert tf": """
import time, sys
t = time.perf_counter()
from hvd_bert.tf.models.bert import BertForPreTraining, build_model, load_weights, read_checkpoint_weights
arrays, config = read_checkpoint_weights(sys.argv[1])
load_weights(build_model(BertForPreTraining(config)), arrays, source="bench")
print(time.perf_counter() - t)""",
    "transformers": """
import time, sys
t = time.perf_counter()
import transformers
transformers.BertForPreTraining.from_pretrained(sys.argv[1])
print(time.perf_counter() - t)""",
}


def timed(loader: str, path: Path) -> float:
    """Seconds from the first import to a model holding the weights (imports included: what a
    user waits for), in a fresh process."""
    out = subprocess.run([sys.executable, "-c", LOADERS[loader], str(path)], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", choices=sorted(PRESETS), default="base")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        formats = make(Path(tmp), args.model)
        for name, path in formats.items():
            loaders = ["hvd_bert pt", "hvd_bert tf"] + (["transformers"] if name.startswith("hf") else [])
            times = {k: [] for k in loaders}
            for _ in range(args.repeats):  # alternating, so drift hits every loader alike
                for k in loaders:
                    times[k].append(timed(k, path))
            rows.append({"format": name, **{k: statistics.median(v) for k, v in times.items()}})
    print(f"BERT-{args.model} checkpoint load, median of {args.repeats} fresh processes (s, imports included)")
    print(f"{'format':<22} {'hvd_bert pt':>12} {'hvd_bert tf':>12} {'transformers':>13} {'pt / tfm':>9}")
    for r in rows:
        tfm = r.get("transformers")
        ratio = f"{r['hvd_bert pt'] / tfm:.2f}x" if tfm else "-"
        print(f"{r['format']:<22} {r['hvd_bert pt']:>12.2f} {r['hvd_bert tf']:>12.2f} "
              f"{(f'{tfm:.2f}' if tfm else '-'):>13} {ratio:>9}")
    out = Path(__file__).parent / "results" / "checkpoint_load.json"
    out.write_text(json.dumps({"model": args.model, "repeats": args.repeats, "rows": rows,
                               "time": time.strftime("%Y-%m-%d %H:%M")}, indent=1))


if __name__ == "__main__":
    main()
