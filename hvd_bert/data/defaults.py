"""The built-in data, for a run that names none: the cache folder (``HVD_BERT_CACHE``, else
``~/.cache/hvd_bert``), the default corpus (Python's standard library docstrings) with its
WordPiece vocabulary, and the prepared sets the jobs fall back on."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from hvd_bert.data.corpus import write_stdlib_corpus
from hvd_bert.data.sidecar import SIDECAR
from hvd_bert.data.vocab import train_vocab
from hvd_bert.files import atomic_write

__all__ = ["cache_dir", "default_corpus", "default_data", "default_ncf_data", "pretrain_defaults",
           "ncf_defaults", "pretrain_data_hint"]


def cache_dir() -> Path:
    """Where the toolkit keeps what it builds once: corpora, prepared sets, compiled kernels."""
    return Path(os.environ.get("HVD_BERT_CACHE", Path.home() / ".cache" / "hvd_bert"))


def default_corpus(vocab_size: int = 8192, lower: bool = True, build: bool = True, vocab=None):
    """The built-in corpus and its WordPiece vocab, made once and cached (a trained vocab is not
    bit-reproducible: the trainer breaks frequency ties in hash order)."""
    folder = cache_dir() / "corpus"
    corpus = folder / f"stdlib-py{sys.version_info[0]}.{sys.version_info[1]}.txt"
    if vocab is None:
        vocab = folder / f"vocab-{vocab_size}-{'uncased' if lower else 'cased'}.txt"
        if build and not vocab.is_file():
            write_stdlib_corpus(corpus)
            with tempfile.TemporaryDirectory() as tmp:
                made = train_vocab([corpus], tmp, vocab_size, lower)
                atomic_write(vocab, lambda t: t.write_bytes(made.read_bytes()))
    if build:
        write_stdlib_corpus(corpus)
    return corpus, vocab


def default_data(max_seq_length: int = 128) -> Path:
    """Where ``hvd-bert prepare-bert`` without ``--output`` puts the built-in corpus's shards."""
    return cache_dir() / "data" / f"stdlib-seq{max_seq_length}"


def default_ncf_data() -> Path:
    """The synthetic ml-1m data under the cache, prepared by the first process that needs it
    (a file lock keeps concurrent ranks from preparing it twice)."""
    import fcntl

    from hvd_bert.data.ncf import prepare_ncf

    folder = cache_dir() / "data" / "ncf-synthetic-ml-1m"
    if not (folder / SIDECAR).is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / ".ncf-synthetic-ml-1m.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / SIDECAR).is_file():
                prepare_ncf(folder, synthetic="ml-1m", seed=0, overwrite=True)
    return folder


def pretrain_defaults(cfg):
    """A pretraining config without ``data``: the built-in corpus's shards."""
    return cfg if cfg.data else replace(cfg, data=str(default_data(cfg.max_seq_length)))


def ncf_defaults(cfg):
    """An NCF config without ``data``: an evaluation of a trained run (``do_train=false``), the
    data that run trained on (its config.json says); else the synthetic ml-1m set."""
    if cfg.data:
        return cfg
    trained = _trained_on(cfg.init_checkpoint) if not cfg.do_train and cfg.init_checkpoint else None
    return replace(cfg, data=trained or str(default_ncf_data()))


def _trained_on(checkpoint: str) -> str | None:
    """The ``data`` of the run folder holding ``checkpoint`` (the folder, ``RUN/ckpt-*`` or
    ``RUN/best/ckpt-*``), when its config.json names one."""
    from hvd_bert.files import read_json_object

    p = Path(checkpoint).expanduser()
    for folder in (p, *list(p.parents)[:2]):
        try:
            data = read_json_object(folder / "config.json").get("data")
        except (OSError, ValueError):
            continue
        if isinstance(data, str) and data:
            return data
    return None


def pretrain_data_hint(cfg) -> str:
    """What to add to a data error of a pretraining run whose folder was never prepared."""
    if (Path(cfg.data).expanduser() / SIDECAR).is_file():  # prepared: the error says the rest
        return ""
    return (f"\n  to prepare the built-in corpus: hvd-bert prepare-bert --output {cfg.data} "
            f"--max-seq-length {cfg.max_seq_length}")
