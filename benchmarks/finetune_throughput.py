"""BERT fine-tuning throughput on real-length inputs: hvd_bert (batches padded to their longest
sequence after length grouping, ``finetune``'s default) against Hugging Face transformers'
``BertForSequenceClassification`` / ``BertForQuestionAnswering`` with the usual fixed padding
to ``max_seq_length``, same model config, batch, threads and optimizer, in the same run; and
hvd_bert with fixed padding, which separates the model's share from the padding's.

    .venv/bin/pip install -r requirements-bench.txt
    .venv/bin/python benchmarks/finetune_throughput.py --task sentences --preset small --batch 32
    .venv/bin/python benchmarks/finetune_throughput.py --task squad --preset small --batch 8

The inputs are real text: sentences of the built-in corpus (Python's standard library
docstrings and comments, one per line) as a single-sentence classification set at
``max_seq_length`` 128, or its documents cut into SQuAD-sized paragraphs (60-250 words,
SQuAD v1.1's range) with a question taken from each, converted as ``run_squad`` does at 384 /
stride 128 / query 64. Both are prepared once by hvd_bert (``prepare_classification``,
``prepare_squad``) with a vocabulary trained on the corpus; every variant reads the same
prepared records through hvd_bert's PyTorch reader. Each variant runs in its own process,
the variants alternate for ``--repeats`` rounds, and the figure is sequences per second over
``--steps`` steps (one length group, so that short and long batches are both counted) after
``--warmup`` steps. A step is forward, loss, backward and an AdamW step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peers import transformers_bert_config  # benchmarks/peers.py

VARIANTS = ("hvd_bert", "hvd_bert-fixed-padding", "transformers")


def prepare(task: str, root: Path, examples: int) -> Path:
    """The prepared set (and its token lengths) in ``root``; made once."""
    from hvd_bert.data.classification import prepare_classification
    from hvd_bert.data.vocab import train_vocab
    from hvd_bert.data.corpus import stdlib_documents

    out = root / task
    if (out / "dataset.json").is_file():
        return out
    docs = stdlib_documents(6_000_000)
    text = root / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    vocab = train_vocab([text], root / "vocab", vocab_size=30522)
    rng = random.Random(0)
    if task == "sentences":
        sentences = [s for d in docs for s in d if len(s.split()) >= 3]
        rng.shuffle(sentences)
        table = root / "sentences.tsv"
        table.write_text("sentence\tlabel\n" + "".join(
            f"{' '.join(s.split())}\t{n % 2}\n" for n, s in enumerate(sentences[:examples])))
        prepare_classification(table, out, vocab, text_a="sentence", label="label", max_seq_length=128,
                               num_shards=1)
        return out
    from hvd_bert.data.squad import prepare_squad

    words = [w for d in docs for s in d for w in s.split()]
    articles, at = [], 0
    for q in range(examples):
        n = rng.randint(60, 250)
        at = 0 if at + n > len(words) else at  # a small corpus is read again
        para = words[at:at + n]
        at += n
        ask = rng.randrange(len(para) - 8)
        context = " ".join(para)
        answer = para[ask + 6]
        start = len(" ".join(para[:ask + 6])) + 1
        articles.append({"title": str(q), "paragraphs": [{"context": context, "qas": [{
            "id": str(q), "question": " ".join(para[ask:ask + 6]) + "?",
            "answers": [{"text": answer, "answer_start": start}]}]}]})
    src = root / "squad.json"
    src.write_text(json.dumps({"version": "1.1", "data": articles}))
    prepare_squad(src, out, vocab, max_seq_length=384, doc_stride=128, max_query_length=64, num_shards=1,
                  log=lambda *_: None)
    return out


def lengths(folder: Path) -> list[int]:
    from hvd_bert.data.kinds import spec_for_meta
    from hvd_bert.data.records import decode_batch, iter_records
    from hvd_bert.data.sidecar import read_sidecar

    meta = read_sidecar(folder, ("bert-classification", "bert-squad"))
    recs = [r for s in meta["shards"] for _, r in iter_records(folder / s["file"])]
    return decode_batch(recs, spec_for_meta(meta))["input_mask"].sum(axis=1).tolist()


def run_variant(variant: str, folder: str, preset: str, b: int, steps: int, warmup: int, group: int,
                threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    from hvd_bert.config.bert import bert_preset
    from hvd_bert.data.sidecar import read_sidecar
    from hvd_bert.pt.data import ShardedDataset

    meta = read_sidecar(folder, ("bert-classification", "bert-squad"))
    squad = meta["kind"] == "bert-squad"
    cfg = bert_preset(preset, vocab_size=meta["vocab_size"])
    grouping = group if variant == "hvd_bert" else 0
    stream = ShardedDataset(folder, meta["kind"], 0, 1, b, seed=0, shuffle_buffer=1024,
                            length_grouping=grouping).stream()
    torch.manual_seed(0)
    if variant.startswith("hvd_bert"):
        from hvd_bert.pt.models import bert as M
        model = M.BertForQuestionAnswering(cfg) if squad else M.BertForSequenceClassification(cfg, 2)
        loss_of = M.span_loss if squad else M.classification_loss

        def loss_fn(batch):
            return loss_of(model, batch)[0]
    else:
        import transformers
        hf_cfg = transformers_bert_config(cfg, num_labels=2)
        model = (transformers.BertForQuestionAnswering if squad else
                 transformers.BertForSequenceClassification)(hf_cfg)

        def loss_fn(batch):
            kw = dict(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                      token_type_ids=batch["segment_ids"])
            if squad:
                kw.update(start_positions=batch["start_positions"].view(-1),
                          end_positions=batch["end_positions"].view(-1))
            else:
                kw.update(labels=batch["label_ids"].view(-1))
            return model(**kw).loss
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(batch):
        loss_fn(batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step(next(stream))
    widths, start = [], time.perf_counter()
    for _ in range(steps):
        batch = next(stream)
        widths.append(int(batch["input_ids"].shape[1]))
        step(batch)
    took = time.perf_counter() - start
    return {"variant": variant, "seconds": took, "sequences_per_s": steps * b / took,
            "mean_width": statistics.mean(widths), "params": sum(x.numel() for x in model.parameters())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=["sentences", "squad"], default="sentences")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32, help="timed steps (default: one length group)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--group", type=int, default=32, help="batches per length group (finetune's default)")
    ap.add_argument("--examples", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--data", help="folder for the prepared inputs (default: a temporary one)")
    ap.add_argument("--json")
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._worker:
        print("RESULT " + json.dumps(run_variant(a._worker, a.data, a.preset, a.batch, a.steps, a.warmup,
                                                 a.group, a.threads)))
        return
    tmp = None if a.data else tempfile.TemporaryDirectory()
    root = Path(a.data or tmp.name)
    root.mkdir(parents=True, exist_ok=True)
    folder = prepare(a.task, root, a.examples)
    lens = sorted(lengths(folder))
    seq = 384 if a.task == "squad" else 128
    print(f"{a.task}: {len(lens)} records, tokens per record: median {lens[len(lens) // 2]}, "
          f"90th percentile {lens[int(len(lens) * 0.9)]}, max {lens[-1]} (padded to {seq})")

    def child(worker):
        cmd = [sys.executable, __file__, "--_worker", worker, "--data", str(folder), "--preset", a.preset,
               "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--group", str(a.group), "--threads", str(a.threads)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{worker} failed:\n{res.stderr[-3000:]}")
        return json.loads(res.stdout.split("RESULT ", 1)[1])

    rounds: dict[str, list] = {v: [] for v in a.variants}
    for _ in range(a.repeats):
        for v in a.variants:
            rounds[v].append(child(v))
    rows = []
    for v, rs in rounds.items():
        rows.append({"variant": v, "sequences_per_s": statistics.median(r["sequences_per_s"] for r in rs),
                     "mean_width": rs[0]["mean_width"], "params": rs[0]["params"]})
    base = next((r for r in rows if r["variant"] == "transformers"), rows[-1])
    print(f"BERT-{a.preset}, batch {a.batch}, {a.steps} steps, fp32, {a.threads} threads")
    for r in rows:
        r["speedup_vs_transformers"] = r["sequences_per_s"] / base["sequences_per_s"]
        print(f"  {r['variant']:<24} {r['sequences_per_s']:8.2f} seq/s  mean width {r['mean_width']:6.1f}  "
              f"x{r['speedup_vs_transformers']:.2f} vs transformers  ({r['params'] / 1e6:.1f}M params)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"task": a.task, "preset": a.preset, "batch": a.batch, "steps": a.steps,
                       "threads": a.threads, "median_tokens": lens[len(lens) // 2], "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
