"""The memory plan (``hvd-bert pretrain``'s plan line: ``core.model_size.rank_memory`` for the
training state, ``core.activations.step_peak_bytes`` for the activations) against the peak
resident memory (``VmHWM``) of real training steps on the CPU, per configuration.

    .venv/bin/python benchmarks/memory_plan.py --threads 2 --json benchmarks/results/memory_plan.json

Each configuration runs in a fresh process: its baseline is its peak after importing PyTorch
and hvd_bert and one training step of a BERT of 64 tokens and 32 hidden units (the interpreter,
the libraries, the code and pools a first step loads); then hvd_bert's BERT for pretraining
(fp32, dropout 0.1, a 30,522-token vocabulary) and its LAMB optimizer take ``--steps``
optimizer steps of the pretraining loss (15% of the positions masked). The plan's figure is
that baseline plus the planned weights, gradients, optimizer state and activations of the local
batch; the error is measured against it (positive: the process used more than planned).
``--mmap-threshold BYTES`` runs the children with glibc's ``MALLOC_MMAP_THRESHOLD_`` fixed (by
default glibc raises it as large blocks are freed, and keeps later freed blocks in its heap).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import emit, peak_bytes, pretraining_batch  # noqa: E402

# (preset, sequence, local batch, activation_checkpointing): BERT-mini to BERT-Base, sequence 128
# and 512, checkpointing off and on
CONFIGS = [("mini", 128, 16, "off"), ("mini", 128, 16, "layers"), ("mini", 512, 4, "off"),
           ("mini", 512, 4, "layers"), ("small", 512, 4, "attention"), ("base", 128, 4, "off"),
           ("base", 512, 2, "off"), ("base", 512, 2, "layers")]


def one(preset: str, seq: int, batch: int, policy: str, steps: int, threads: int) -> dict:
    import torch

    from hvd_bert.config.bert import bert_preset
    from hvd_bert.config.train import OptimConfig, activation_policy
    from hvd_bert.core.activations import ActivationShape, step_peak_bytes
    from hvd_bert.core.model_size import bert_parameters, rank_memory
    from hvd_bert.core.optim import state_buffers
    from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss
    from hvd_bert.pt.optim import build_optimizer

    torch.set_num_threads(threads)

    def train(model, b: dict, steps: int) -> None:
        opt = build_optimizer(model.named_parameters(), OptimConfig(name="lamb"), lr=1e-4)
        for _ in range(steps):
            loss, _ = pretraining_loss(model, b)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)

    # the runtime's own memory (the libraries' code and pools a first training step loads: the
    # autograd engine, oneDNN's kernels) is the baseline: one step of a BERT with 64 tokens
    tiny = BertForPreTraining(bert_preset("tiny", vocab_size=64, hidden_size=32, intermediate_size=64))
    tiny.activation_checkpointing(*activation_policy(policy))
    train(tiny, pretraining_batch(64, 2, 16, 2), 1)
    del tiny
    baseline = peak_bytes()
    config = bert_preset(preset, vocab_size=30522)
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    model.activation_checkpointing(*activation_policy(policy))
    p = max(1, round(seq * 0.15))
    train(model, pretraining_batch(30522, batch, seq, p), steps)
    measured = peak_bytes()
    split, whole = bert_parameters(config)
    state = rank_memory(split, whole, buffers=state_buffers("lamb"), zero_stage=0, tensor_parallel=1,
                        data_parallel=1)
    x = ActivationShape(config.hidden_size, config.num_layers, config.num_heads, config.intermediate_size,
                        seq, batch, p, config.padded_vocab_size)
    act = step_peak_bytes(x, "fp32", *activation_policy(policy))
    planned = baseline + state.total + act
    return {"preset": preset, "seq": seq, "batch": batch, "activation_checkpointing": policy,
            "baseline_bytes": baseline, "state_bytes": state.total, "activation_bytes": act,
            "planned_bytes": planned, "vmhwm_bytes": measured, "error": (measured - planned) / planned}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", type=int, nargs="+", help="indices into the configurations")
    ap.add_argument("--mmap-threshold", type=int, help="glibc's MALLOC_MMAP_THRESHOLD_ for the children")
    ap.add_argument("--json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # (a configuration's index: the child)
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(one(*CONFIGS[a.one], a.steps, a.threads)))
        return
    runs = []
    for i in a.only if a.only is not None else range(len(CONFIGS)):
        out = subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--threads", str(a.threads),
                              "--one", str(i)], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(a.threads),
                                  **({"MALLOC_MMAP_THRESHOLD_": str(a.mmap_threshold)} if a.mmap_threshold
                                     else {})})
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = runs[-1]
        print(f"{r['preset']:>5} seq {r['seq']:>3} batch {r['batch']:>2} {r['activation_checkpointing']:>9}: "
              f"planned {r['planned_bytes'] / 2**30:.2f} GiB, VmHWM {r['vmhwm_bytes'] / 2**30:.2f} GiB "
              f"({r['error']:+.1%})", file=sys.stderr, flush=True)
    result = {"mmap_threshold": a.mmap_threshold, "runs": runs,
              "worst_error": max(abs(r["error"]) for r in runs)}
    emit(result, a.json)

if __name__ == "__main__":
    main()
