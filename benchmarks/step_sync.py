"""The PyTorch step with no host synchronisation, checked and timed on a device: BERT
pretraining steps through the engine (1 rank, Horovod) with NVLAMB in bf16, in bf16 with bf16
weights over fp32 masters (``train.precision.weights=bf16``: "bf16w") and in fp16 with loss
scaling, at ZeRO stage 0 and 1, each step decided on the device (``Engine.step_on_device``); the
peak memory of each (CUDA's allocations) beside its time.

    .venv/bin/python benchmarks/step_sync.py --device cuda --preset base --seq 128 --batch 32

On CUDA every step runs under ``torch.cuda.set_sync_debug_mode("error")``: a host read inside
the step (an ``item``, a ``bool`` of a tensor, a copy to the host) raises there. Each
configuration then times ``--steps`` steps read after every step (``train.host_reads=step``)
against the same steps read once at the end (``log``), side by side. On a CPU (``--smoke``) the
same code runs with the reads counted by patching ``torch.Tensor`` instead. Prints one JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from synthetic import emit, pretraining_batch  # noqa: E402

@contextlib.contextmanager
def no_host_reads(device: str, seen: list):
    """CUDA's sync debug mode at "error"; on a CPU the reads counted into ``seen``."""
    import torch

    from hvd_bert.pt.step import host_reads

    if device.startswith("cuda"):
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return
    with host_reads() as reads:
        yield
    seen += reads


def run(a, precision: str, stage: int) -> dict:
    import torch

    from hvd_bert.config import TrainConfig, apply_overrides
    from hvd_bert.config.bert import bert_preset
    from hvd_bert.pt.engine import Engine
    from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss

    torch.manual_seed(0)
    model = BertForPreTraining(bert_preset(a.preset, vocab_size=30522)).to(a.device)
    cfg = apply_overrides(TrainConfig(), [
        "optim.name=nvlamb", "optim.lr=1e-4", f"zero.stage={stage}", f"precision.mode={precision[:4]}",
        f"precision.weights={'bf16' if precision == 'bf16w' else 'fp32'}",
        f"batch.local_batch_size={a.batch}", "batch.backward_passes_per_step=1", "schedule.name=constant"])
    engine = Engine.from_config(model, cfg, loss_fn=pretraining_loss, device=a.device)
    predictions = max(1, a.seq * 15 // 100)
    batch = {k: v.to(a.device) for k, v in pretraining_batch(30522, a.batch, a.seq, predictions).items()}
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):  # warm-up (allocations, kernels chosen)
        engine.finish_step(engine.train_micro_batch(batch, defer=True), {})
    seen: list = []
    with no_host_reads(a.device, seen):
        pending = [engine.train_micro_batch(batch, defer=True) for _ in range(3)]
    engine.finish_steps([(p, {}) for p in pending])
    times = {}
    for reads in ("step", "log", "step", "log"):  # alternating: a drift hits both
        sync()
        t0 = time.perf_counter()
        pending = []
        for _ in range(a.steps):
            pending.append((engine.train_micro_batch(batch, defer=True), dict(engine.last_metrics)))
            if reads == "step":
                engine.finish_steps(pending)
                pending = []
        engine.finish_steps(pending)
        sync()
        times[reads] = min(times.get(reads, float("inf")), (time.perf_counter() - t0) / a.steps)
    return {"precision": precision, "zero_stage": stage, "host_reads_in_3_steps": len(seen),
            "reads_seen": sorted(set(seen)), "step_s_read_every_step": times["step"],
            "step_s_read_at_the_end": times["log"], "every_step_vs_end": times["step"] / times["log"],
            "peak_bytes": torch.cuda.max_memory_allocated() if a.device.startswith("cuda") else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: a check of this script")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.smoke:
        a.preset, a.seq, a.batch, a.steps = "tiny", 32, 4, 2
    if not a.device.startswith("cuda"):
        import os

        # the device's path: the CPU's C kernels (optimizer, dropout) read host memory, which is
        # no synchronisation on a CPU but would count here
        os.environ["HVD_BERT_FUSED_OPTIM"] = os.environ["HVD_BERT_FAST_DROPOUT"] = "0"
    precisions = ("bf16", "bf16w", "fp16")
    rows = [run(a, p, stage) for p in precisions for stage in (0, 1)]
    ok = all(r["host_reads_in_3_steps"] == 0 for r in rows)
    emit({"device": a.device, "preset": a.preset, "seq": a.seq, "batch": a.batch, "steps": a.steps,
          "no_host_reads": ok, "rows": rows}, a.json)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
