"""The prepared sets a fine-tuning run takes, framework-free: which task they are
(classification, regression, SQuAD), the training and evaluation sets checked against each
other and against ``task``, and how many optimizer steps the epochs make."""

from __future__ import annotations

import math
from pathlib import Path


from hvd_bert.data.kinds import FINETUNE_KINDS, KIND_SQUAD, KIND_TOKENS
from hvd_bert.config import ConfigError, FinetuneConfig
from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import label_fault, read_sidecar
from hvd_bert.core.sharding import check_epochs, epoch_batches

__all__ = ["label_fault", "tag_fault", "id2label_names", "SQUAD", "CLASSIFICATION", "REGRESSION", "TOKENS",
           "task_of", "check_finetune_data", "total_steps",
           "TASK_FILE", "task_record", "read_task_record", "prediction_mismatch", "check_record_values"]

TASK_FILE = "task.json"  # in a fine-tuning run folder: what the model was trained to predict

SQUAD, CLASSIFICATION, REGRESSION = "squad", "classification", "regression"
TOKENS = "token-classification"  # (a label a word: NER)
TOOLS = {SQUAD: "prepare-squad", TOKENS: "prepare-token-classification"}  # (else prepare-classification)


def task_of(meta: dict) -> str:
    """What a prepared training set is fine-tuned for: ``squad``, ``token-classification``,
    ``regression`` or ``classification``."""
    if meta["kind"] == KIND_SQUAD:
        return SQUAD
    if meta["kind"] == KIND_TOKENS:
        return TOKENS
    return REGRESSION if meta.get("regression") else CLASSIFICATION


def _check_task(cfg: FinetuneConfig, meta: dict, folder: str) -> str:
    task = task_of(meta)
    if cfg.task and cfg.task not in (task, meta.get("task")):
        what = meta.get("task") or task
        tool = TOOLS.get(cfg.task, "prepare-classification")
        raise ConfigError(f"task {cfg.task!r}: {folder} holds {what} data ({meta['kind']}); prepare the "
                          f"{cfg.task} data (hvd-bert {tool}) or drop --task")
    return task


def check_finetune_data(cfg: FinetuneConfig) -> tuple[dict, dict | None]:
    """The sidecars of the training and evaluation sets, checked against each other and
    against ``cfg.task``."""
    if not cfg.do_train and not cfg.data:  # prediction only: the evaluation set says what the task is
        if not cfg.eval_data:
            raise ConfigError("do_train=false only evaluates: give eval_data=DIR (and init_checkpoint, "
                              "e.g. a fine-tuned run folder)")
        ev = read_sidecar(cfg.eval_data, FINETUNE_KINDS)
        _check_task(cfg, ev, cfg.eval_data)
        if ev["kind"] == KIND_SQUAD and ev["is_training"]:
            raise DatasetError(f"eval_data {cfg.eval_data} was prepared with --split train; prepare the dev "
                               f"file with --split dev")
        return ev, ev
    if not cfg.data:
        raise ConfigError("data: give the training set (a folder from hvd-bert prepare-classification or "
                          "prepare-squad): --set data=DIR")
    train = read_sidecar(cfg.data, FINETUNE_KINDS)
    task = _check_task(cfg, train, cfg.data)

    def damaged(what: str) -> DatasetError:
        return DatasetError(f"{cfg.data}/dataset.json is damaged ({what}); prepare the data again")
    check_task_record(task_record(train), damaged)  # (what the run's task.json will say, checked now)
    check_record_values(cfg.data, train)
    if task == SQUAD and not train["is_training"]:
        raise DatasetError(f"{cfg.data} holds SQuAD features prepared for prediction (--split dev, no answer "
                           f"positions); prepare the training file with --split train")
    ev = None
    if cfg.eval_data:
        ev = read_sidecar(cfg.eval_data, train["kind"])
        if task == SQUAD:
            from hvd_bert.data.squad import read_side_files

            if ev["is_training"]:
                raise DatasetError(f"eval_data {cfg.eval_data} was prepared with --split train; prepare "
                                   f"the dev file with --split dev (prediction needs every window)")
            read_side_files(cfg.eval_data, ev)  # (checked before training, on every rank)
            keys = ("vocab_sha256", "max_seq_length", "do_lower_case", "version_2_with_negative")
            fix = "the same vocab, case, --max-seq-length and --version-2-with-negative"
        else:
            keys = ("labels", "vocab_sha256", "max_seq_length", "regression")
            fix = ("the same vocab and --max-seq-length" + ("" if train.get("regression") else
                                                            f" and --labels {' '.join(train['labels'])}"))
        for key in keys:
            if ev.get(key) != train.get(key):
                raise DatasetError(f"eval_data {cfg.eval_data} has {key} {ev.get(key)!r}, the training set "
                                   f"{train.get(key)!r}; prepare it with {fix}")
    if ev is not None:
        check_record_values(cfg.eval_data, ev)
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
    steps = max(1, math.ceil(cfg.epochs * per_epoch / k))
    # every epoch of the run gives every rank a batch (a rank's shards change from epoch to epoch)
    check_epochs(files, counts, world_size, local_batch_size, steps * k, cfg.train.seed, striding)
    return steps


def task_record(meta: dict) -> dict:
    """What a fine-tuned model predicts and how its inputs are made, from its training set's
    sidecar: the task, the label names in the classifier's order (``labels``), the GLUE task if
    any, and the tokenization (case, sequence length, the vocabulary's hash; the run folder
    holds the ``vocab.txt``); SQuAD adds v2.0 or not, the document stride and the question's
    length."""
    rec = {"task": task_of(meta), "labels": meta.get("labels"), "glue_task": meta.get("task"),
           "do_lower_case": meta.get("do_lower_case"), "max_seq_length": meta.get("max_seq_length"),
           "vocab_sha256": meta.get("vocab_sha256")}
    if rec["task"] == SQUAD:  # how questions and contexts become features
        rec.update({k: meta.get(k) for k in ("version_2_with_negative", "doc_stride", "max_query_length")})
    return rec


def tag_fault(tag: str) -> str | None:
    """Why ``tag`` is not an entity tag (``O``, or ``B-``/``I-``/``E-``/``S-`` and a type)."""
    if tag == "O":
        return None
    prefix, _, kind = tag.partition("-")
    if prefix in ("B", "I", "E", "S") and kind.strip():
        return None
    return f"the tag {tag!r} is not O or B-/I-/E-/S- and an entity type (IOB or IOBES, e.g. B-PER)"


def id2label_names(hf: dict, where: str) -> list | None:
    """The label names of a Hugging Face ``config.json`` (``hf``, read from ``where``), by output
    index; None when it has no ``id2label``. A map that is not one-to-one (a name twice, indices
    that are not 0..n-1, a ``label2id`` that disagrees) is a DatasetError naming the file."""
    id2label = hf.get("id2label")
    if id2label is None or id2label == {}:
        return None

    def bad(what: str) -> DatasetError:
        return DatasetError(f"{where}: {what}; give id2label as {{\"0\": name, \"1\": name, ...}} with "
                            f"each output's own name, and label2id its inverse")
    if not isinstance(id2label, dict):
        raise bad(f"id2label is {type(id2label).__name__}, not an object")
    keys = sorted(id2label, key=lambda k: (len(k), k))
    if keys != [str(i) for i in range(len(id2label))]:
        raise bad(f"id2label's keys {keys[:6]} are not the outputs 0 to {len(id2label) - 1}")
    names = [id2label[str(i)] for i in range(len(id2label))]
    fault = label_fault(names)
    if fault:
        raise bad(fault)
    label2id = hf.get("label2id")
    if isinstance(label2id, dict) and label2id and label2id != {n: i for i, n in enumerate(names)}:
        raise bad("label2id is not the inverse of id2label")
    return names


def _checked_task(path: Path) -> dict:
    """A run folder's task record, every field a reader uses checked (a DatasetError otherwise)."""
    import json

    def bad(what: str) -> DatasetError:
        return DatasetError(f"{path} is damaged ({what}): it says what the model predicts; restore it from "
                            f"the run, or fine-tune again")
    try:
        rec = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise bad(f"{type(e).__name__}: {e}") from None
    return check_task_record(rec, bad)


def check_task_record(rec, bad) -> dict:
    """A task record (a run's ``task.json``, or what fine-tuning makes of its data's sidecar:
    ``task_record``) with every field a reader uses checked; ``bad(what)`` makes the error."""
    if not isinstance(rec, dict) or rec.get("task") not in (SQUAD, CLASSIFICATION, REGRESSION, TOKENS):
        raise bad("no task of squad, classification, regression or token-classification")
    labels = rec.get("labels")
    if rec["task"] == TOKENS:
        if labels is None or label_fault(labels) or any(tag_fault(t) for t in labels):
            raise bad(label_fault(labels) or next(filter(None, map(tag_fault, labels)), "no labels"))
    if rec["task"] in (REGRESSION, SQUAD) and labels not in (None, []):  # (no label map: one value, spans)
        raise bad(f"labels {labels!r} for a {rec['task']} model, which has none")
    if rec["task"] not in (REGRESSION, SQUAD) and labels is not None and label_fault(labels):
        raise bad(label_fault(labels))
    for key in ("max_seq_length", "doc_stride", "max_query_length"):
        v = rec.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 16):
            raise bad(f"{key} {v!r} is not a count from 1 to 65536")
    if isinstance(rec.get("max_seq_length"), int) and rec["max_seq_length"] < 3:
        raise bad(f"max_seq_length {rec['max_seq_length']} leaves no room for text between [CLS] and [SEP]")
    if rec["task"] == SQUAD and isinstance(rec.get("max_seq_length"), int) \
            and isinstance(rec.get("max_query_length"), int) \
            and rec["max_seq_length"] < rec["max_query_length"] + 4:
        raise bad(f"max_seq_length {rec['max_seq_length']} leaves no room for context after a question of "
                  f"{rec['max_query_length']}")
    glue = rec.get("glue_task")
    if glue is not None:
        from hvd_bert.data.glue import TASKS

        if not isinstance(glue, str) or glue not in TASKS:
            raise bad(f"glue_task {glue!r} is not one of {sorted(TASKS)}")
        kind = REGRESSION if TASKS[glue].labels is None else CLASSIFICATION
        if kind != rec["task"] or (labels is not None and kind == CLASSIFICATION
                                   and sorted(labels) != sorted(TASKS[glue].labels)):
            raise bad(f"glue_task {glue!r} is a {kind} task with labels {TASKS[glue].labels}, the record's "
                      f"task is {rec['task']} with labels {labels}")

    for key in ("do_lower_case", "version_2_with_negative"):
        if rec.get(key) is not None and not isinstance(rec[key], bool):
            raise bad(f"{key} {rec[key]!r} is not true or false")
    return rec


def read_task_record(checkpoint: str | Path) -> dict | None:
    """The task record of a fine-tuned run folder (or of the folder of one of its checkpoints),
    or the labels of a Hugging Face folder whose ``config.json`` names them; None if neither."""
    import json

    from hvd_bert.train.checkpoint import checkpoint_folder

    folder = checkpoint_folder(checkpoint)
    if (folder / TASK_FILE).is_file():
        return _checked_task(folder / TASK_FILE)
    try:
        hf = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    except (OSError, ValueError, RecursionError):
        return None
    names = id2label_names(hf, str(folder / "config.json")) if isinstance(hf, dict) else None
    if names and "BertForTokenClassification" in (hf.get("architectures") or []):
        return {"task": TOKENS, "labels": names, "glue_task": None}
    if names and names != [f"LABEL_{i}" for i in range(len(names))]:
        return {"task": CLASSIFICATION, "labels": names, "glue_task": None}
    return None


def prediction_mismatch(checkpoint: str, eval_meta: dict, eval_data: str) -> str | None:
    """Why ``eval_data`` cannot be scored by the fine-tuned ``checkpoint``: another task, or other
    labels (names or order: the scores would be read against the wrong classes); None if the
    checkpoint does not say, or agrees."""
    rec = read_task_record(checkpoint)
    if rec is None:
        return None
    task = task_of(eval_meta)
    if rec["task"] != task:
        return (f"init_checkpoint {checkpoint} was fine-tuned for {rec['task']}, eval_data {eval_data} holds "
                f"{task} data; give the {task} checkpoint, or data prepared for {rec['task']}")
    if task == CLASSIFICATION and rec.get("labels") and eval_meta.get("labels") != rec["labels"]:
        return (f"eval_data {eval_data} has the labels {eval_meta.get('labels')}, init_checkpoint "
                f"{checkpoint} was fine-tuned on {rec['labels']} (in that order): prepare it again with "
                f"--labels {' '.join(rec['labels'])}")
    return None


def check_record_values(folder: str | Path, meta: dict, batch: int = 2048) -> None:
    """Every record's token ids within the sidecar's vocabulary and its label ids within its
    labels (-1: a position not scored), in one pass over the shards: a value past them would
    index outside the model's tables in either framework. A DatasetError naming the shard."""
    from hvd_bert.data.kinds import spec_for_meta
    from hvd_bert.data.records import decode_batch, iter_records

    spec = spec_for_meta(meta)
    vocab = meta.get("vocab_size")
    n_labels = len(meta["labels"]) if meta.get("labels") and "label_ids" in spec else None
    lowest = -1 if meta.get("kind") == KIND_TOKENS else 0

    def check(path: Path, records: list) -> None:
        got = decode_batch(records, spec)
        ids = got.get("input_ids")
        if isinstance(vocab, int) and ids is not None and ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = int(ids.max() if ids.max() >= vocab else ids.min())
            raise DatasetError(f"{path}: a record holds the token id {bad}, outside the {vocab} tokens "
                               f"{Path(folder) / 'dataset.json'} names; prepare the data again")
        labels = got.get("label_ids")
        if n_labels is not None and labels is not None and labels.size \
                and (labels.min() < lowest or labels.max() >= n_labels):
            bad = int(labels.max() if labels.max() >= n_labels else labels.min())
            raise DatasetError(f"{path}: a record holds the label id {bad}, outside the {n_labels} labels "
                               f"{Path(folder) / 'dataset.json'} names; prepare the data again")
    for shard in meta.get("shards", []):
        path = Path(folder) / shard["file"]
        records = []
        for _, record in iter_records(path):
            records.append(record)
            if len(records) == batch:
                check(path, records)
                records = []
        if records:
            check(path, records)
