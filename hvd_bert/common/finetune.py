"""The framework-free parts of fine-tuning: checking the prepared sets, how many steps the
epochs are, and which evaluation records each rank scores.

Evaluation is exact: every record of the evaluation set is scored once. Rank ``r`` of ``P``
takes the records whose index (over the files in order) is ``r mod P``, in batches without
dropping a remainder; the correct counts and totals are summed with an allreduce.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator

import numpy as np

from hvd_bert.common.bert_data import KIND_CLASSIFY, spec_for_meta
from hvd_bert.common.config import ConfigError, FinetuneConfig
from hvd_bert.common.records import DatasetError, decode_batch, iter_records, read_sidecar
from hvd_bert.common.sharding import epoch_batches
from hvd_bert.common.vocab import init_vocab_error

__all__ = ["check_finetune_data", "total_steps", "eval_batches", "resolve_init", "Evaluation",
           "evaluate_classification"]


def check_finetune_data(cfg: FinetuneConfig) -> tuple[dict, dict | None]:
    """The sidecars of the training and evaluation sets, checked against each other."""
    if not cfg.data:
        raise ConfigError("data: give the training set (a folder from hvd-bert prepare-classification): "
                          "--set data=DIR")
    train = read_sidecar(cfg.data, KIND_CLASSIFY)
    ev = None
    if cfg.eval_data:
        ev = read_sidecar(cfg.eval_data, KIND_CLASSIFY)
        for key in ("labels", "vocab_sha256", "max_seq_length"):
            if ev[key] != train[key]:
                raise DatasetError(f"eval_data {cfg.eval_data} has {key} {ev[key]!r}, the training set "
                                   f"{train[key]!r}; prepare it with the same vocab, --max-seq-length and "
                                   f"--labels {' '.join(train['labels'])}")
    return train, ev


def total_steps(cfg: FinetuneConfig, meta: dict, world_size: int, local_batch_size: int, k: int) -> int:
    """Optimizer steps for ``cfg.epochs`` epochs (every rank reads the same number of batches)."""
    if cfg.epochs == 0:
        return cfg.train.schedule.total_steps
    files = [s["file"] for s in meta["shards"]]
    counts = [s["records"] for s in meta["shards"]]
    striding = len(files) < world_size
    per_epoch = epoch_batches(files, counts, world_size, local_batch_size, 0, cfg.train.seed, striding)
    if per_epoch < k:
        raise DatasetError(f"{cfg.data}: {meta['total_records']} examples make {per_epoch} batches of "
                           f"{local_batch_size} per rank on {world_size} ranks, fewer than one optimizer "
                           f"step of {k}; lower train.batch.local_batch_size")
    return max(1, math.ceil(cfg.epochs * per_epoch / k))


def eval_batches(folder: str | Path, meta: dict, rank: int, world_size: int,
                 batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """This rank's share of the evaluation records (see the module docstring), decoded, in
    batches; the last one may be short, and a rank may have none."""
    spec = spec_for_meta(meta)
    rows, index = [], 0
    for shard in meta["shards"]:
        for _, rec in iter_records(Path(folder) / shard["file"]):
            if index % world_size == rank:
                rows.append(rec)
                if len(rows) == batch_size:
                    yield decode_batch(rows, spec)
                    rows = []
            index += 1
    if rows:
        yield decode_batch(rows, spec)


def evaluate_pretraining(score, batches: Iterator[dict[str, np.ndarray]], allreduce) -> dict:
    """Held-out masked-LM loss and accuracy (over the real predictions, ``masked_lm_weights``)
    and next-sentence accuracy over the whole set: ``score(batch)`` gives ``(mlm_logits
    [B, P, V], nsp_logits [B, 2])``; ``allreduce`` sums the ranks' ``[mlm loss sum, mlm
    correct, predictions, nsp correct, sequences]`` (a collective)."""
    sums = np.zeros(5)
    for b in batches:
        mlm, nsp = (np.asarray(x, np.float64) for x in score(b))
        ids, w = b["masked_lm_ids"], b["masked_lm_weights"].astype(np.float64)
        top = mlm.max(axis=-1, keepdims=True)
        log_z = np.log(np.exp(mlm - top).sum(axis=-1)) + top[..., 0]
        nll = log_z - np.take_along_axis(mlm, ids[..., None].astype(np.int64), axis=-1)[..., 0]
        labels = b["next_sentence_labels"].reshape(-1)
        sums += [(nll * w).sum(), ((mlm.argmax(-1) == ids) * w).sum(), w.sum(),
                 (nsp.argmax(-1) == labels).sum(), len(labels)]
    s = np.asarray(allreduce(sums))
    return {"eval_mlm_loss": float(s[0] / max(s[2], 1)), "eval_mlm_accuracy": float(s[1] / max(s[2], 1)),
            "eval_nsp_accuracy": float(s[3] / max(s[4], 1)), "eval_examples": int(s[4])}


def evaluate_classification(score, batches: Iterator[dict[str, np.ndarray]], allreduce,
                            num_labels: int | None = None, task: str | None = None) -> dict:
    """Accuracy, mean cross-entropy and the task's metrics (:func:`glue.task_metrics`: MCC for
    CoLA, F1 for MRPC/QQP and any two-label set) over the whole set: ``score(batch)`` gives
    the logits ``[B, labels]`` of one batch of :func:`eval_batches`, ``allreduce`` sums the
    ranks' ``[loss sum, count, confusion matrix...]`` (a collective: every rank must call it,
    with or without batches of its own, and so ``num_labels`` is given, not seen)."""
    from hvd_bert.common.glue import confusion, task_metrics

    cm, sums = None, np.zeros(2)
    for b in batches:
        logits = np.asarray(score(b), np.float64)
        labels = b["label_ids"].reshape(-1)
        num_labels = num_labels or logits.shape[1]
        top = logits.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        nll = log_z - logits[np.arange(len(labels)), labels]
        part = confusion(logits.argmax(axis=1), labels, num_labels)
        cm = part if cm is None else cm + part
        sums += [nll.sum(), len(labels)]
    if num_labels is None:
        raise ValueError("num_labels is needed on a rank without evaluation batches")
    cm = np.zeros((num_labels, num_labels)) if cm is None else cm
    totals = np.asarray(allreduce(np.concatenate([sums, cm.ravel().astype(np.float64)])))
    cm = np.rint(totals[2:]).astype(np.int64).reshape(num_labels, num_labels)
    n = max(totals[1], 1.0)
    out = {"eval_accuracy": float(np.trace(cm) / n), "eval_loss": float(totals[0] / n),
           "eval_examples": int(totals[1])}
    out.update(task_metrics(task, cm))
    return out


def resolve_init(cfg: FinetuneConfig, meta: dict, read_checkpoint_weights) -> tuple:
    """On rank 0: ``(arrays or None, BertConfig, error or None)`` for the fine-tuning model:
    the pretrained weights and their config (``read_checkpoint_weights`` is the frontend's),
    or the ``model`` preset without ``init_checkpoint``; a vocabulary that differs from the
    data's is an error. The error comes back as text so that it can be broadcast to the
    other ranks (which then stop too)."""
    from hvd_bert.common.bert_config import bert_preset
    from hvd_bert.common.bert_weights import WeightsError

    arrays = config = None
    try:
        if cfg.init_checkpoint:
            arrays, config = read_checkpoint_weights(cfg.init_checkpoint)
        config = config or bert_preset(cfg.model, vocab_size=meta["vocab_size"])
        error = init_vocab_error(cfg.init_checkpoint, config.vocab_size, cfg.data, meta,
                                 "prepare-classification") if cfg.init_checkpoint else None
        if error:
            raise WeightsError(error)
    except WeightsError as e:
        return None, None, str(e)
    return arrays, config, None


class Evaluation:
    """The fine-tuning jobs' evaluation: ``report(step)`` runs ``evaluate()`` (a collective
    returning ``eval_accuracy``, ``eval_loss``, ``eval_examples``), prints and records it; as
    ``fit``'s ``on_step`` hook it reports every ``eval_every`` steps before the last (the
    job reports the last itself)."""

    def __init__(self, cfg: FinetuneConfig, total_steps: int, log, evaluate):
        self.cfg, self.total, self.log, self.evaluate = cfg, total_steps, log, evaluate

    def report(self, step: int) -> dict:
        res = self.evaluate()
        extra = "".join(f", {k[5:].upper() if k != 'eval_f1' else 'F1'} {v:.4f}" for k, v in res.items()
                        if k in ("eval_f1", "eval_mcc"))
        self.log.print(f"eval at step {step}: accuracy {res['eval_accuracy']:.4f}{extra} on "
                       f"{res['eval_examples']} examples (loss {res['eval_loss']:.4f})")
        self.log.record({"step": step, **res}, prefix="eval", show=False)
        return res

    def __call__(self, result, _metrics=None) -> bool:
        every = self.cfg.eval_every
        if self.cfg.eval_data and every and result.step % every == 0 and result.step < self.total:
            self.report(result.step)
        return False
