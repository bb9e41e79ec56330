"""Activation checkpointing (``train.activation_checkpointing``) on the CPU: each policy's peak
memory and step time for hvd_bert's PyTorch BERT, side by side in one run.

    .venv/bin/python benchmarks/activation_checkpointing.py --preset base --seq 512 --batches 1 2 \\
        --budget-gib 16 --steps 2 --threads 2

Each (policy, batch) runs in a fresh process (its peak resident memory, ``VmHWM``, is its own):
the model (fp32, dropout 0.1), then ``--steps`` timed forward and backward passes of the
pretraining loss after one warm-up (no optimizer: its state is the same for every policy). The
memory a sequence adds is the peak's slope over ``--batches``; the largest local batch that fits
``--budget-gib`` follows from it. Prints one JSON object (``--json FILE`` also writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import emit, peak_bytes, pretraining_batch  # noqa: E402

POLICIES = ("off", "layers", "layers:2", "attention")


def one(preset: str, seq: int, batch: int, policy: str, steps: int, threads: int, device: str = "cpu",
        precision: str = "fp32") -> dict:
    import torch

    from hvd_bert.config.bert import bert_preset
    from hvd_bert.config.train import activation_policy
    from hvd_bert.core.activations import ActivationShape, step_peak_bytes
    from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = bert_preset(preset, vocab_size=30522)
    model = BertForPreTraining(config).to(device)
    model.activation_checkpointing(*activation_policy(policy))
    cuda = device.startswith("cuda")
    p = max(1, round(seq * 0.15))
    b = pretraining_batch(30522, batch, seq, p)
    b = {k: v.to(device) for k, v in b.items()}
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss, _ = pretraining_loss(model, b)
        loss.backward()
        model.zero_grad(set_to_none=False)
        if cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    hwm = peak_bytes(device)  # (a GPU: the weights and gradients, then the activations)
    x = ActivationShape(config.hidden_size, config.num_layers, config.num_heads, config.intermediate_size,
                        seq, batch, p, config.padded_vocab_size)
    planned = step_peak_bytes(x, precision, *activation_policy(policy), flash=cuda)
    return {"policy": policy, "batch": batch, "peak_bytes": hwm, "step_s": min(times),
            "planned_activation_bytes": planned}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="base")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--budget-gib", type=float, default=16.0)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--json")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # (policy, batch): the child's part
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.preset, a.seq, int(a.one[1]), a.one[0], a.steps, a.threads, a.device,
                             a.precision)))
        return
    runs = []
    for batch in a.batches:
        for policy in a.policies:  # (alternating: a drift in the machine's speed hits every policy)
            out = subprocess.run([sys.executable, __file__, "--preset", a.preset, "--seq", str(a.seq),
                                  "--steps", str(a.steps), "--threads", str(a.threads), "--one", policy,
                                  str(batch), "--device", a.device, "--precision", a.precision],
                                 capture_output=True, text=True, check=True,
                                 env={**os.environ, "OMP_NUM_THREADS": str(a.threads)})
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    lo, hi = min(a.batches), max(a.batches)
    budget = a.budget_gib * 2**30
    summary = {}
    for policy in a.policies:
        got = {r["batch"]: r for r in runs if r["policy"] == policy}
        per_seq = (got[hi]["peak_bytes"] - got[lo]["peak_bytes"]) / max(1, hi - lo)
        fixed = got[lo]["peak_bytes"] - lo * per_seq
        off = next(r for r in runs if r["policy"] == "off" and r["batch"] == hi)
        fits = int((budget - fixed) // per_seq) if per_seq > 0 else None
        plan = [got[b]["planned_activation_bytes"] for b in (lo, hi)]
        planned = (plan[1] - plan[0]) / max(1, hi - lo)
        summary[policy] = {"bytes_per_sequence": per_seq, "planned_bytes_per_sequence": planned,
                           "fixed_bytes": fixed,
                           "largest_batch_in_budget": fits, "step_s": got[hi]["step_s"],
                           "step_time_vs_off": got[hi]["step_s"] / off["step_s"]}
    result = {"preset": a.preset, "seq": a.seq, "device": a.device, "precision": a.precision,
              "budget_gib": a.budget_gib, "runs": runs, "summary": summary}
    emit(result, a.json)


if __name__ == "__main__":
    main()
