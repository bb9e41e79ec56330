"""BERT fine-tuning on Horovod, in either framework: sentence(-pair) classification,
regression (STS-B), token classification (NER) or SQuAD, as the prepared training set says
(``data.finetune.task_of``).

    horovodrun -np 2 -H localhost:2 --gloo hvd-bert finetune --framework pt \\
        --set data=TRAIN_DIR --set eval_data=DEV_DIR --set init_checkpoint=runs/pretrain-pt-stdlib-seq128

The pretrained encoder comes from ``init_checkpoint`` (a run folder, a checkpoint, a portable
``.npz`` from either framework, or a published checkpoint; its model size comes with it);
the task's head starts from BERT's initialisation. Training uses the shared loop:
accumulation, mixed precision, checkpoints, resume and SIGTERM as in pretraining; batches are
padded to their longest sequence (``length_grouping``). The evaluation scores every record
of ``eval_data`` once across the ranks; for SQuAD rank 0 then writes ``predictions.json``
(``nbest_predictions.json``, and ``null_odds.json`` for v2.0) to the run folder and reports
the official EM and F1.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hvd_bert.config import ConfigError, FinetuneConfig
from hvd_bert.config.bert import bert_preset
from hvd_bert.core.text import plural
from hvd_bert.data.finetune import (REGRESSION, SQUAD, TASK_FILE, TOKENS, check_finetune_data,
                                   prediction_mismatch, task_of, task_record, total_steps)
from hvd_bert.data.vocab import init_vocab_error
from hvd_bert.evaluation.finetune import (Evaluation, best_metric_of, eval_batches, evaluate_classification,
                                          evaluate_regression, evaluate_squad)
from hvd_bert.evaluation.token_classification import evaluate_tokens
from hvd_bert.jobs.run_folder import finish_line, open_run, ranks_agree, with_run_folder
from hvd_bert.files import atomic_write, read_json_object
from hvd_bert.train.checkpoint import file_crc
from hvd_bert.train.engine import ResumeError
from hvd_bert.train.identity import has_checkpoints
from hvd_bert.train.loop import fit
from hvd_bert.train.watchdog import end_start
from hvd_bert.weights.portable import WeightsError, save_weights

__all__ = ["run"]


def run(cfg: FinetuneConfig, backend) -> dict:
    if cfg.train.tensor_parallel > 1:
        raise ConfigError("train.tensor_parallel > 1 is for pretraining (hvd-bert pretrain) so far; "
                          "fine-tune with train.tensor_parallel=1")
    if cfg.do_train:
        cfg = with_run_folder(cfg, "finetune")
    else:  # runs/predict-<framework>-<eval data name>
        named = with_run_folder(replace(cfg, data=cfg.eval_data), "predict")
        cfg = replace(cfg, train=replace(cfg.train, output_dir=named.train.output_dir))
    rank, size = backend.init(cfg.train)
    ranks_agree(cfg, backend)  # the same settings and data everywhere, or one line on every rank
    out = Path(cfg.train.output_dir)
    meta, eval_meta = check_finetune_data(cfg)
    metric = best_metric_of(cfg, task_of(meta), meta.get("task"))  # (a misspelt one: before anything runs)
    if not cfg.do_train and not cfg.eval_data:
        raise ConfigError("do_train=false only evaluates: give eval_data=DIR (and init_checkpoint, e.g. a "
                          "fine-tuned run folder)")
    backend.set_precision(cfg.train.precision.mode)

    # The pretrained weights are read on rank 0; every rank learns the model config (or the error).
    arrays, config, error = (resolve_init(cfg, meta, backend.read_checkpoint_weights) if rank == 0
                             else (None, None, None))
    config, error = backend.broadcast_object((config, error), "hvd_bert.finetune.config")
    if error:
        raise WeightsError(error)
    bert = replace(config, hidden_dropout=cfg.dropout, attention_dropout=cfg.dropout)
    backend.seed(cfg.train.seed + rank)
    task, seq = task_of(meta), meta["max_seq_length"]
    if task == SQUAD:
        model, loss, what = backend.bert_span(bert, seq), backend.span_loss, "SQuAD span head"
        line_keys, about = ("loss", "span_accuracy", "lr", "examples_per_s"), (
            f"{meta['total_records']} features of {meta['examples']} questions"
            f"{' (v2.0, with impossible answers)' if meta['version_2_with_negative'] else ''}")
    elif task == TOKENS:
        model = backend.bert_token_classifier(bert, len(meta["labels"]), seq)
        loss, what = backend.token_classification_loss, "token classifier"
        line_keys = ("loss", "accuracy", "lr", "examples_per_s")
        about = (f"{meta['sentences']} sentences ({meta['total_records']} records), {meta['words']} words, "
                 f"tags {meta['labels']}")
    elif task == REGRESSION:
        model, loss, what = backend.bert_classifier(bert, 1, seq), backend.regression_loss, "regression head"
        line_keys = ("loss", "lr", "examples_per_s")
        about = f"{meta['total_records']} examples, a numeric label"
    else:
        model, loss = backend.bert_classifier(bert, len(meta["labels"]), seq), backend.classification_loss
        what, line_keys = "classifier", ("loss", "accuracy", "lr", "examples_per_s")
        about = f"{meta['total_records']} examples, labels {meta['labels']}"
    backend.activation_checkpointing(model, cfg.train.activation_checkpointing)
    if arrays is not None:
        backend.load_weights(model, arrays, source=f"init_checkpoint {cfg.init_checkpoint}")
    plan = cfg.train.batch.plan(size)
    steps = total_steps(cfg, meta, size, plan.local_batch_size, plan.backward_passes_per_step)
    cfg = replace(cfg, train=replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=steps)))
    engine = backend.engine(model, loss, cfg.train)
    # (a horizon in epochs was counted with this run's batch: another global batch would change it)
    engine.keep_checkpoint_batch = not cfg.epochs

    log = open_run(cfg, backend, rank, total_steps=steps, bert=bert, line_keys=line_keys)
    if rank == 0 and cfg.do_train:  # what this model predicts, and its vocabulary: hvd-bert predict, exports
        atomic_write(out / TASK_FILE, lambda t: t.write_text(json.dumps(task_record(meta), indent=1)))
        vocab = Path(cfg.data) / meta["vocab_file"]
        atomic_write(out / "vocab.txt", lambda t: t.write_bytes(vocab.read_bytes()))
    origin = "from " + cfg.init_checkpoint if arrays is not None else "from scratch"
    if cfg.do_train:
        log.print(f"fine-tuning BERT ({origin}, {backend.label}, {what}) on {cfg.data}: {about}, "
                  + (f"{plural(cfg.epochs, 'epoch')} = " if cfg.epochs else "train.schedule.total_steps: ")
                  + plural(steps, 'step'))
    else:
        log.print(f"evaluating BERT ({origin}, {backend.label}, {what}) on {cfg.eval_data}: {about}")

    score = backend.scorer(model, cfg.train.precision.mode)
    trim = 8 if cfg.length_grouping else 0
    ev = eval_meta or meta

    def evaluate():
        batches = eval_batches(cfg.eval_data, ev, rank, size, cfg.eval_batch_size, trim)
        allreduce = lambda totals: backend.allreduce_sum(totals, "hvd_bert.eval")  # noqa: E731
        if task == SQUAD:
            return evaluate_squad(score, batches, allreduce, cfg.eval_data, ev, cfg, rank, out)
        if task == TOKENS:
            return evaluate_tokens(score, batches, allreduce, meta["labels"])
        if task == REGRESSION:
            return evaluate_regression(score, batches, allreduce, ev["total_records"], rank, size)
        return evaluate_classification(score, batches, allreduce, len(meta["labels"]), ev.get("task"))

    share = (lambda res: backend.broadcast_object(res, "hvd_bert.eval.result")) if task == SQUAD else None
    labels = meta.get("labels") or []

    def save_best(step: int, res: dict) -> None:  # rank 0: the best evaluated weights so far
        if rank == 0 and cfg.keep_best and cfg.do_train:
            save_weights(out / "best.npz", backend.export_weights(model), bert)
            atomic_write(out / "best.json", lambda t: t.write_text(json.dumps(
                {"step": step, "metric": metric, "greater_is_better": on_step.larger, "score": res[metric],
                 "scores": res, "crc32c": file_crc(out / "best.npz")}, indent=1)))  # (what it scores)

    on_step = Evaluation(cfg, steps, log, evaluate, share, positive=labels[1] if len(labels) == 2 else None,
                         metric=metric, save_best=save_best)
    resuming = (out / "best.json").is_file() and has_checkpoints(out)
    best = None
    if resuming:  # a resumed run: the best so far stays best
        try:
            best = read_json_object(out / "best.json")
            best_so_far = (float(best["score"]), int(best["step"])) if best.get("metric") == metric else None
        except (ValueError, KeyError, TypeError) as e:
            raise ResumeError(f"{out / 'best.json'} is damaged ({e}): delete it to resume (the best is then "
                              f"tracked from the next evaluation), or restore it") from None
        if best_so_far is not None:
            on_step.best = best_so_far
    kind = meta["kind"]

    def batches_from(micro_step):
        return backend.record_batches(cfg.data, kind, rank, size, plan.local_batch_size,
                                      seed=cfg.train.seed, shuffle_buffer=cfg.shuffle_buffer,
                                      record_striding=len(meta["shards"]) < size, start=micro_step,
                                      length_grouping=cfg.length_grouping)

    if not cfg.do_train:  # prediction only, with init_checkpoint's weights (the engine broadcast them)
        end_start()  # (the start-up is over: an evaluation is not watched)
        final = on_step.report(0)
        log.close()
        if rank == 0:
            print(f"evaluated {cfg.init_checkpoint or 'an untrained model'} on {cfg.eval_data}"
                  + (f"; predictions in {out}" if task == SQUAD else ""), flush=True)
        backend.broadcast_object(None, "hvd_bert.finished")
        return {"steps": 0, "stopped": False, **final}
    res = fit(engine, batches_from, total_steps=steps, output_dir=out, log=log, unit="examples",
              on_step=on_step)
    final = on_step.report(res.steps) if cfg.eval_data else {}
    log.close()
    kept = (f"; best {metric} {on_step.best[0]:.4f} at step {on_step.best[1]}: {out / 'best.npz'}"
            if on_step.best and cfg.keep_best else "")
    finish_line(res, rank, f"checkpoint: {res.checkpoint or 'unchanged'}{kept}", backend, out)
    return {"steps": res.steps, "stopped": res.stopped_by_signal, **final}


def resolve_init(cfg: FinetuneConfig, meta: dict, read_checkpoint_weights) -> tuple:
    """On rank 0: ``(arrays or None, BertConfig, error or None)`` for the fine-tuning model:
    the pretrained weights and their config (``read_checkpoint_weights`` is the frontend's),
    or the ``model`` preset without ``init_checkpoint``; a vocabulary that differs from the
    data's is an error. The error comes back as text so that it can be broadcast to the
    other ranks (which then stop too)."""
    arrays = config = None
    try:
        if cfg.init_checkpoint:
            arrays, config = read_checkpoint_weights(cfg.init_checkpoint)
        config = config or bert_preset(cfg.model, vocab_size=meta["vocab_size"])
        error = init_vocab_error(cfg.init_checkpoint, config.vocab_size, cfg.data, meta,
                                 "prepare-classification") if cfg.init_checkpoint else None
        if error is None and cfg.init_checkpoint and not cfg.do_train:  # a fine-tuned model's own task
            error = prediction_mismatch(cfg.init_checkpoint, meta, cfg.eval_data)
            head = "qa_outputs.weight" if task_of(meta) == SQUAD else "classifier.weight"
            if error is None and head not in arrays:  # (its head would be a fresh one: chance's scores)
                error = (f"init_checkpoint {cfg.init_checkpoint} has no fine-tuned head ({head} missing): "
                         f"do_train=false evaluates a fine-tuned model as it is, and this one's head would "
                         f"be untrained; fine-tune it first (do_train=true), or give a fine-tuned run folder")
        if error:
            raise WeightsError(error)
    except WeightsError as e:
        return None, None, str(e)
    return arrays, config, None
