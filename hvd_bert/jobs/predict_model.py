"""What a fine-tuned checkpoint predicts and how ``hvd-bert predict`` feeds it, framework-free
(the backend builds the model): its task record, its tokenizer, its weights as a scorer."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from hvd_bert.config import ConfigError, PredictConfig
from hvd_bert.data.finetune import REGRESSION, SQUAD, read_task_record
from hvd_bert.data.vocab import load_tokenizer, resolve_vocab
from hvd_bert.files import read_json_object
from hvd_bert.train.checkpoint import checkpoint_folder
from hvd_bert.weights.portable import untrained_head

__all__ = ["model_record", "vocab_mismatch", "tokenizer_of", "load_scorer", "output_path"]


def output_path(cfg: PredictConfig, suffix: str) -> Path:
    """Where the predictions go (``--output``, else ``INPUT<suffix>`` beside the input), refused
    when it would replace or write into the input, the checkpoint or the checkpoint's folder
    (``files.refuse_clash``): checked on every rank before anything is read or written."""
    from hvd_bert.files import refuse_clash
    from hvd_bert.train.checkpoint import run_folder_of

    source = Path(cfg.input).expanduser()
    out = Path(cfg.output).expanduser() if cfg.output else source.with_name(source.name + suffix)
    ckpt = Path(cfg.checkpoint).expanduser()
    refuse_clash(out, {"the input": source, "the checkpoint": ckpt,
                       "the checkpoint's folder": run_folder_of(ckpt)})
    refuse_foreign_files(out, "predict")
    return out


def refuse_foreign_files(out: Path, command: str) -> None:
    """An output never over another run's files (``train.run_folder.refuse_run_files``) nor a
    prepared data folder's (its ``dataset.json``, vocabulary, shards): OutputClash, one line."""
    import errno
    import os

    from hvd_bert.files import OutputClash, owned_name
    from hvd_bert.train.run_folder import refuse_run_files
    from hvd_bert.weights.convert import data_folder_of

    refuse_run_files(out, command)
    data = data_folder_of(out)
    if data is not None and (os.path.lexists(out) or owned_name(Path(out.name))):
        raise OutputClash(errno.EEXIST, f"--output {out} is a file of the prepared data folder {data}: "
                                        f"{command} never writes over prepared data; give --output a path "
                                        f"outside it", str(out))


def model_record(checkpoint: str) -> dict:
    """What ``checkpoint`` predicts (``data.finetune.read_task_record``), or a Hugging Face
    classifier's ``num_labels`` as ``LABEL_i``; a ConfigError naming what to give otherwise."""
    p = Path(checkpoint).expanduser()
    if not p.exists():
        raise ConfigError(f"{checkpoint} does not exist: give a fine-tuning run folder, its best.npz or a "
                          f"ckpt-* in it, or a Hugging Face model folder (check the path)")
    rec = read_task_record(checkpoint)
    if rec is not None:
        return rec
    cfg_file = checkpoint_folder(p) / "config.json"
    try:
        hf = read_json_object(cfg_file) if cfg_file.is_file() else {}
    except (OSError, ValueError):
        hf = {}
    n = int(hf.get("num_labels") or len(hf.get("id2label") or {}))
    if "BertForSequenceClassification" in hf.get("architectures", []) and n:
        return {"task": REGRESSION if n == 1 else "classification",
                "labels": None if n == 1 else [f"LABEL_{i}" for i in range(n)]}
    if "BertForQuestionAnswering" in hf.get("architectures", []):
        return {"task": SQUAD, "labels": None}
    raise ConfigError(f"{checkpoint} does not say what it predicts: give a fine-tuning run folder (it holds "
                      f"task.json), its best.npz or a ckpt-* in it, or a Hugging Face "
                      f"BertForSequenceClassification or BertForQuestionAnswering folder")


def vocab_mismatch(rec: dict, meta: dict, checkpoint: str, source: Path) -> str | None:
    """Why the prepared set ``source`` cannot go into ``checkpoint``: tokenized with another
    vocabulary (the ids would mean other words); None if they agree or one does not say."""
    if rec.get("vocab_sha256") and meta.get("vocab_sha256") and rec["vocab_sha256"] != meta["vocab_sha256"]:
        return (f"{source} was prepared with another vocabulary than {checkpoint} was fine-tuned with: "
                f"prepare it again with --vocab {checkpoint}, or give the raw text")
    return None


def tokenizer_of(checkpoint: str, rec: dict):
    """``(tokenizer, do_lower_case)`` the checkpoint was fine-tuned with: the run folder's
    ``vocab.txt`` (or the Hugging Face folder's tokenizer) and the case of its training data."""
    ckpt = Path(checkpoint).expanduser()
    vocab = resolve_vocab(checkpoint_folder(ckpt))
    lower = rec.get("do_lower_case")
    if lower is None:
        lower = vocab.do_lower_case if vocab.do_lower_case is not None else True
    return load_tokenizer(vocab.path, lower), lower


def load_scorer(backend, cfg: PredictConfig, seq: int, build) -> tuple[Callable, int]:
    """``(score, max_seq_length)``: the checkpoint's weights (read by every rank) in
    ``build(bert_config, max_seq_length)``, as a scorer of batches cut to their longest
    sequence. ``seq`` is capped at the model's positions unless the user asked for it."""
    from hvd_bert.data.padding import trim_padding

    arrays, config = backend.read_checkpoint_weights(cfg.checkpoint)
    limit = config.max_position_embeddings
    if cfg.max_seq_length > limit:
        raise ConfigError(f"max_seq_length {cfg.max_seq_length} is longer than the {limit} positions of "
                          f"{cfg.checkpoint}: give --set max_seq_length={limit} or less")
    seq = min(seq, limit)
    model = build(config, seq)
    untrained = untrained_head(arrays, {k: v.shape for k, v in backend.export_weights(model).items()})
    if untrained:
        raise ConfigError(f"{cfg.checkpoint} has no trained head for what it says it predicts ({untrained}): "
                          f"its weights are a pretrained encoder, or its task record names another task than "
                          f"its head was trained for, so the predictions would come from a random head. "
                          f"Fine-tune it first (hvd-bert finetune --set init_checkpoint={cfg.checkpoint}), "
                          f"or give a fine-tuned checkpoint")
    backend.load_weights(model, arrays, source=f"checkpoint {cfg.checkpoint}")
    score = backend.scorer(model, cfg.precision)
    return (lambda batch: score(trim_padding(batch, 8))), seq
