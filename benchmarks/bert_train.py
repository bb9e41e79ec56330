"""BERT pretraining throughput: hvd_bert's PyTorch BERT against Hugging Face transformers'
``BertForPreTraining`` built from the same config (no download: random weights), with the
same batch, threads, optimizer and precision, in the same run; and hvd_bert's fused bias+GELU
against the unfused composition, in the model and as a kernel, in both frameworks.

    .venv/bin/pip install -r requirements-bench.txt
    .venv/bin/python benchmarks/bert_train.py --preset small --batch 16 --seq 128 --steps 10
    .venv/bin/python benchmarks/bert_train.py --kernels          # the GELU kernels alone
    .venv/bin/python benchmarks/bert_train.py --device cuda --precision bf16 ...  (on a GPU)
    .venv/bin/python benchmarks/bert_train.py --fill 0.92 --variants hvd_bert hvd_bert-packed transformers

``--fill F`` gives the batch padding: a fraction F of its token slots real (Wikipedia's shards:
0.92 at sequence 128, 0.78 at 512), some sequences cut to a random length (as Google's
create_pretraining_data's short sequences and document ends do); ``hvd_bert-packed`` trains
on the same batch packed into fewer rows (``pack_sequences``, ``hvd_bert.data.packing``);
``hvd_bert-compiled`` with its encoder layers under ``torch.compile`` (``compile_layers``).

Each variant runs in its own process (fresh allocator and compile caches), one after the
other, alternating for ``--repeats`` rounds; the figure is the median step time. A training
step is forward, MLM + NSP loss, backward and an AdamW step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from peers import transformers_bert_config  # benchmarks/peers.py

VARIANTS = ("hvd_bert", "hvd_bert-packed", "hvd_bert-compiled", "hvd_bert-unfused", "transformers")


def _batch(torch, vocab, b, s, p, device, fill=1.0, pack=False):
    """A random batch with a fraction ``fill`` of real tokens: a share q of the sequences cut to
    a length uniform in [8, s] (mean fill 1 - q (s - 8) / 2s), the rest full."""
    import numpy as np
    rng = np.random.default_rng(0)
    q = min(1.0, (1.0 - fill) * 2 * s / (s - 8))
    n = np.where(rng.random(b) < q, rng.integers(8, s + 1, b), s)
    mask = (np.arange(s) < n[:, None]).astype(np.int64)
    pos, w = np.zeros((b, p), np.int64), np.zeros((b, p), np.float32)
    for i in range(b):  # about 15% of the real tokens masked, at most p
        k = min(p, max(1, round(0.15 * n[i])))
        pos[i, :k] = np.sort(rng.choice(np.arange(1, n[i]), k, replace=False))
        w[i, :k] = 1
    seg = (np.arange(s) >= (n // 2)[:, None]) * mask
    out = dict(input_ids=rng.integers(5, vocab, (b, s)) * mask, segment_ids=seg,
               input_mask=mask, masked_lm_positions=pos, masked_lm_ids=rng.integers(5, vocab, (b, p)),
               masked_lm_weights=w, next_sentence_labels=rng.integers(0, 2, (b, 1)))
    if pack:
        from hvd_bert.data.packing import pack_batch
        out = pack_batch(out)
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in out.items()}


def run_variant(variant: str, preset: str, b: int, s: int, p: int, steps: int, warmup: int, threads: int,
                device: str, precision: str, fill: float = 1.0, vocab: int = 30522) -> dict:
    if variant == "hvd_bert-unfused":
        os.environ["HVD_BERT_COMPILE"] = "0"
    import torch
    torch.set_num_threads(threads)
    from hvd_bert.config.bert import bert_preset
    cfg = bert_preset(preset, vocab_size=vocab)
    batch = _batch(torch, cfg.vocab_size, b, s, p, device, fill, pack=variant == "hvd_bert-packed")
    torch.manual_seed(0)
    if variant.startswith("hvd_bert"):
        from hvd_bert.pt.models.bert import BertForPreTraining, pretraining_loss
        model = BertForPreTraining(cfg).to(device)
        if variant == "hvd_bert-compiled":
            model.compile_layers()  # (compile_layers; the warm-up steps compile)

        def loss_fn():
            return pretraining_loss(model, batch)[0]
    else:
        import transformers
        hf_cfg = transformers_bert_config(cfg)
        model = transformers.BertForPreTraining(hf_cfg).to(device)
        labels = torch.full((b, s), -100, dtype=torch.long, device=device)
        real = batch["masked_lm_weights"] > 0
        labels.scatter_(1, batch["masked_lm_positions"], torch.where(real, batch["masked_lm_ids"], -100))

        def loss_fn():
            return model(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                         token_type_ids=batch["segment_ids"], labels=labels,
                         next_sentence_label=batch["next_sentence_labels"].view(-1)).loss
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")

    def step():
        with torch.autocast(torch.device(device).type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    n_params = sum(x.numel() for x in model.parameters())
    return {"variant": variant, "median_s": statistics.median(times), "params": n_params,
            "sequences_per_s": b / statistics.median(times), "step_s": times,
            "rows": int(batch["input_ids"].shape[0]), "real_tokens": int(batch["input_mask"].sum())}


def kernels(threads: int, repeats: int) -> list[dict]:
    """bias+GELU fused vs unfused at BERT-Base's intermediate shape, forward + backward."""
    import torch
    torch.set_num_threads(threads)
    from hvd_bert.pt.kernels import gelu as K
    out = []
    x0 = torch.randn(16 * 128, 3072)
    bias0 = torch.randn(3072)

    def pt(fn):
        x, b = x0.clone().requires_grad_(), bias0.clone().requires_grad_()
        y = fn(x, b)
        y.backward(torch.ones_like(y))

    for name, fn in (("pt fused (C loop)", K.bias_gelu), ("pt fused (torch.compile)", K.bias_gelu_compiled),
                     ("pt unfused (eager)", K.bias_gelu_eager)):
        for _ in range(3):
            pt(fn)
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            pt(fn)
            ts.append(time.perf_counter() - t)
        out.append({"kernel": name, "median_ms": 1e3 * statistics.median(ts)})
    return out


def tf_kernels(threads: int, repeats: int) -> list[dict]:
    import hvd_bert.tf  # noqa: F401
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    from hvd_bert.tf import kernels as K
    x = tf.random.normal([16 * 128, 3072])
    b = tf.random.normal([3072])

    def make(fn, jit):
        @tf.function(jit_compile=jit)
        def f(x, b):
            with tf.GradientTape() as tape:
                tape.watch([x, b])
                y = fn(x, b)
            return tape.gradient(y, [x, b])
        return f

    out = []
    for name, f in (("tf fused (XLA)", make(K.bias_gelu_eager, True)),
                    ("tf unfused (graph, no XLA)", make(K.bias_gelu_eager, False))):
        for _ in range(3):
            [g.numpy() for g in f(x, b)]
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            [g.numpy() for g in f(x, b)]
            ts.append(time.perf_counter() - t)
        out.append({"kernel": name, "median_ms": 1e3 * statistics.median(ts)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--predictions", type=int, default=20)
    ap.add_argument("--fill", type=float, default=1.0, help="fraction of real tokens in the batch")
    ap.add_argument("--vocab", type=int, default=30522, help="vocabulary size")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="alternating rounds of all variants")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--kernels", action="store_true", help="only the bias+GELU kernels")
    ap.add_argument("--json")
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._worker == "kernels-pt":
        print("RESULT " + json.dumps(kernels(a.threads, 20)))
        return
    if a._worker == "kernels-tf":
        print("RESULT " + json.dumps(tf_kernels(a.threads, 20)))
        return
    if a._worker:
        print("RESULT " + json.dumps(run_variant(a._worker, a.preset, a.batch, a.seq, a.predictions, a.steps,
                                                 a.warmup, a.threads, a.device, a.precision, a.fill,
                                                 a.vocab)))
        return

    def child(worker):
        cmd = [sys.executable, __file__, "--_worker", worker, "--preset", a.preset, "--batch", str(a.batch),
               "--seq", str(a.seq), "--predictions", str(a.predictions), "--steps", str(a.steps),
               "--warmup", str(a.warmup), "--threads", str(a.threads), "--device", a.device,
               "--precision", a.precision, "--fill", str(a.fill), "--vocab", str(a.vocab)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        if res.returncode != 0:
            raise SystemExit(f"{worker} failed:\n{res.stderr[-3000:]}")
        return json.loads(res.stdout.split("RESULT ", 1)[1])

    report: dict = {"preset": a.preset, "batch": a.batch, "seq": a.seq, "predictions": a.predictions,
                    "fill": a.fill, "threads": a.threads, "device": a.device, "precision": a.precision}
    if a.kernels:
        report["kernels"] = child("kernels-pt") + child("kernels-tf")
        for k in report["kernels"]:
            print(f"{k['kernel']:<28} {k['median_ms']:8.2f} ms  (bias+GELU fwd+bwd, 2048 x 3072)")
    else:
        rounds: dict[str, list] = {v: [] for v in a.variants}
        for _ in range(a.repeats):
            for v in a.variants:
                rounds[v].append(child(v))
        rows = []
        for v, rs in rounds.items():
            med = statistics.median(r["median_s"] for r in rs)
            rows.append({"variant": v, "step_s": med, "sequences_per_s": a.batch / med, "rows": rs[0]["rows"],
                         "params": rs[0]["params"], "round_medians_s": [r["median_s"] for r in rs],
                         "round_steps_s": [r["step_s"] for r in rs]})
        base = next((r for r in rows if r["variant"] == "transformers"), rows[-1])
        print(f"BERT-{a.preset}, batch {a.batch} x seq {a.seq} ({a.predictions} masked, {a.fill:.2f} of the "
              f"tokens real), {a.precision}, {a.device}, {a.threads} threads")
        for r in rows:
            r["speedup_vs_transformers"] = base["step_s"] / r["step_s"]
            print(f"  {r['variant']:<18} {r['step_s'] * 1e3:9.1f} ms/step  "
                  f"{r['sequences_per_s']:8.1f} seq/s  "
                  f"x{r['speedup_vs_transformers']:.2f} vs transformers  ({r['params'] / 1e6:.1f}M params, "
                  f"{r['rows']} rows)")
        if a.repeats > 1 and "transformers" in rounds:
            # the ratio round by round: a round's processes ran back to back, on the same machine
            peer = next(r for r in rows if r["variant"] == "transformers")["round_medians_s"]
            for r in rows:
                r["round_speedups"] = [p / o for p, o in zip(peer, r["round_medians_s"])]
                if r["variant"] != "transformers":
                    print(f"  {r['variant']:<18} round by round: "
                          + ", ".join(f"x{q:.2f}" for q in r["round_speedups"]))
        report["rows"] = rows
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
