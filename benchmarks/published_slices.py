"""Each rank's peak memory while a published BERT-Large (a Hugging Face folder, fp32
safetensors, 1.34 GB) loads into its tensor-parallel share, read by slices (the job's way:
``read_checkpoint_weights`` then ``load_weights``, each rank reading only its share of each split
tensor, one tensor at a time) against the whole-file read every rank did before
(``safetensors.numpy.load_file``, then the same shares), under TP 2 and TP 4, each its own
``horovodrun --gloo`` job, in the same run.

    .venv/bin/python benchmarks/published_slices.py [--tp 2 4] [--json out.json]

Per rank: the resident memory before the load (the model's share built), and the peak of the
load above it (``ru_maxrss`` after the load, less the resident memory before).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(tp: int, folder: str, how: str) -> None:
    import resource

    import horovod.torch as hvd
    import torch

    from hvd_bert.pt import init_horovod
    from hvd_bert.pt.models.bert import BertForPreTraining, read_checkpoint_weights
    from hvd_bert.pt.tensor_parallel import build, load_whole
    from hvd_bert.weights.hf import hf_to_portable, read_hf_config

    torch.set_num_threads(1)
    init_horovod(process_sets=True)
    config, _ = read_hf_config(folder)
    model = build(lambda: BertForPreTraining(config), seed=0, std=0.02, tp=tp, device="cpu")
    share = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    before = rss_bytes()
    if how == "slices":
        arrays, _ = read_checkpoint_weights(folder)
    else:
        from safetensors.numpy import load_file
        arrays = hf_to_portable(load_file(str(Path(folder) / "model.safetensors")), config, folder)
    load_whole(model, arrays, model.tp_groups, folder)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    hvd.barrier()
    print("RESULT " + json.dumps(dict(rank=hvd.rank(), tp=tp, how=how, share=share, before=before,
                                      load_peak=peak - before)), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--json")
    ap.add_argument("--worker", nargs=3, metavar=("TP", "FOLDER", "HOW"))
    args = ap.parse_args()
    if args.worker:
        return worker(int(args.worker[0]), args.worker[1], args.worker[2])
    import torch
    import transformers

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "bert-large"
        torch.manual_seed(0)
        large = transformers.BertForPreTraining(transformers.BertConfig(vocab_size=30522, **LARGE))
        large.save_pretrained(folder)
        del large
        size = (folder / "model.safetensors").stat().st_size
        print(f"BERT-Large, Hugging Face folder: model.safetensors {size / 2**30:.2f} GiB")
        horovodrun = str(Path(sys.executable).parent / "horovodrun")
        for tp in args.tp:
            for how in ("slices", "whole"):
                cmd = [horovodrun, "--gloo", "-np", str(tp), sys.executable, __file__, "--worker", str(tp),
                       str(folder), how]
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                                     env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
                got = [json.loads(ln.split("RESULT ", 1)[1]) for ln in res.stdout.splitlines()
                       if "RESULT " in ln]
                if res.returncode != 0 or len(got) != tp:
                    sys.exit(f"TP {tp} {how} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
                rows.extend(dict(r, file=size) for r in got)
                worst = max(r["load_peak"] for r in got)
                print(f"TP {tp}, {how:6s}: each rank's share {got[0]['share'] / 2**30:.2f} GiB; load peak "
                      f"above it {worst / 2**30:.2f} GiB (worst rank) = {worst / size:.2f}x the file",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
