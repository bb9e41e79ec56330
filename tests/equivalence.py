"""The whole training path against implementations nobody on this project wrote: the shared
part of tests/pt/test_training_equivalence.py and tests/tf/test_training_equivalence_tf.py.

One random ``transformers.BertForPreTraining`` (the size of hvd_bert's ``tiny`` preset, dropout
off) is saved with ``save_pretrained``; small pretraining shards are prepared with
``hvd_bert.data.pretraining.prepare_bert``. ``run_job`` runs ``hvd-bert pretrain`` on them
from that folder (one process, AdamW, global-norm clipping, Google's linear warmup and decay,
a metrics line every step) and returns its per-step losses and its final weights under
Hugging Face's names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

STEPS, BATCH, SEQ, PRED = 10, 8, 64, 10
PEAK_LR, WEIGHT_DECAY, MAX_NORM, WARMUP = 1e-3, 0.01, 0.5, 0.2
BETAS, EPS = (0.9, 0.999), 1e-6
SHUFFLE = 64


def google_lr(t: int) -> float:
    """Google BERT's ``create_optimizer`` schedule (linear warmup over ``WARMUP * STEPS``
    steps, then ``polynomial_decay`` with power 1 to 0), written from optimization.py, at the
    1-based number ``t`` of the update (NVIDIA's PolyWarmUpScheduler and hvd_bert count the
    update being made; Google's graph reads ``global_step`` before incrementing it)."""
    warmup_steps = int(WARMUP * STEPS)
    if t < warmup_steps:
        return PEAK_LR * t / warmup_steps
    return PEAK_LR * (1.0 - min(t, STEPS) / STEPS)


def job_settings(data: Path, init: Path, out: Path, seed: int, **extra) -> list[str]:
    sets = {"data": data, "init_checkpoint": init, "train.output_dir": out, "model": "tiny",
            "dropout": 0.0, "progress": "false", "max_seq_length": SEQ, "max_predictions_per_seq": PRED,
            "shuffle_buffer": SHUFFLE, "train.seed": seed,
            "train.batch.local_batch_size": BATCH, "train.batch.backward_passes_per_step": 1,
            "train.optim.name": "adamw", "train.optim.lr": PEAK_LR, "train.optim.weight_decay": WEIGHT_DECAY,
            "train.optim.beta1": BETAS[0], "train.optim.beta2": BETAS[1], "train.optim.eps": EPS,
            "train.optim.max_grad_norm": MAX_NORM,
            "train.schedule.name": "poly_warmup", "train.schedule.power": 1.0,
            "train.schedule.warmup": WARMUP,
            "train.schedule.total_steps": STEPS, "train.log_every": 1, "train.checkpoint_every": 0,
            **extra}
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def make_inputs(tmp: Path, seed: int, doc_lines: int = 0) -> tuple[Path, Path]:
    """Prepared shards and a Hugging Face folder of the ``tiny`` size with their vocabulary
    (``doc_lines`` > 0: the corpus cut into documents of that many lines, whose ends make
    create_pretraining_data end sequences early: more padding)."""
    import torch
    import transformers

    from hvd_bert.data.masking import PretrainingSettings

    from hvd_bert.data.pretraining import prepare_bert
    from hvd_bert.data.corpus import write_stdlib_corpus

    corpus = write_stdlib_corpus(tmp / "corpus.txt", max_bytes=120_000)
    if doc_lines:
        lines = [ln for ln in corpus.read_text().splitlines() if ln.strip()]
        docs = ("\n".join(lines[i:i + doc_lines]) for i in range(0, len(lines), doc_lines))
        corpus.write_text("\n\n".join(docs))
    data = tmp / "data"
    settings = PretrainingSettings(max_seq_length=SEQ, max_predictions_per_seq=PRED, dupe_factor=1, seed=seed)
    meta = prepare_bert([corpus], data, vocab_size=1000, num_shards=2, settings=settings, log=lambda *_: None)
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=meta["vocab_size"], hidden_size=128, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=512, hidden_act="gelu_new",
                                  max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForPreTraining(cfg)
    with torch.no_grad():  # random biases and norms too, so that every parameter's update is checked
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model.save_pretrained(tmp / "hf")
    return data, tmp / "hf"


def run_job(framework: str, data: Path, init: Path, out: Path, seed: int,
            **extra) -> tuple[list[float], dict]:
    """``hvd-bert pretrain`` in one process (``extra``: more settings): its logged loss of every
    step and its final weights as a ``transformers.BertForPreTraining`` state dict of numpy arrays."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "pretrain", "--framework", framework,
                          *job_settings(data, init, out, seed, **extra)],
                         capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("kind", "train") == "train" and "loss" in r]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, STEPS + 1))
    if framework == "pt":
        from hvd_bert.pt.models.bert import read_checkpoint_weights
    else:
        from hvd_bert.tf.models.bert import read_checkpoint_weights
    from hvd_bert.weights.hf import portable_to_hf

    arrays, config = read_checkpoint_weights(out)
    return losses, portable_to_hf(arrays, config)


def hf_batch(b: dict):
    """A batch of hvd_bert's reader as ``BertForPreTraining``'s inputs: the masked positions
    become per-token labels (-100 elsewhere), so Hugging Face's mean over the labelled tokens
    is the masked-LM loss."""
    import torch

    ids = torch.as_tensor(np.asarray(b["input_ids"]), dtype=torch.long)
    labels = torch.full_like(ids, -100)
    pos = np.asarray(b["masked_lm_positions"])
    lab = np.asarray(b["masked_lm_ids"])
    w = np.asarray(b["masked_lm_weights"])
    for i in range(pos.shape[0]):
        for j in range(pos.shape[1]):
            if w[i, j] > 0:
                labels[i, pos[i, j]] = int(lab[i, j])
    return dict(input_ids=ids, token_type_ids=torch.as_tensor(np.asarray(b["segment_ids"]), dtype=torch.long),
                attention_mask=torch.as_tensor(np.asarray(b["input_mask"]), dtype=torch.long), labels=labels,
                next_sentence_label=torch.as_tensor(np.asarray(b["next_sentence_labels"]),
                                                    dtype=torch.long).view(-1))
