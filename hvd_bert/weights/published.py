"""Which published checkpoint a path is, read into the portable form: a Hugging Face folder,
a Google TF1 checkpoint (read by TensorFlow, in its own process: the caller's ``read_google``),
or an NVIDIA DeepLearningExamples ``.pt`` beside its ``bert_config.json``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from hvd_bert.config.bert import BertConfig
from hvd_bert.weights.google import google_checkpoint_prefix, read_google_config
from hvd_bert.weights.hf import hf_to_portable, is_hf_folder, read_hf_folder
from hvd_bert.weights.portable import WeightsError

__all__ = ["read_published", "is_nvidia_checkpoint", "read_nvidia", "checkpoint_config"]


def checkpoint_config(path: str | Path) -> BertConfig | None:
    """The architecture a checkpoint holds, read without its weights: a Hugging Face folder's
    ``config.json``, a Google or NVIDIA checkpoint's ``bert_config.json``, a run folder's (or a
    run checkpoint's) ``bert_config.json``, a portable ``.npz``'s own; None when it says none."""
    import zipfile

    from hvd_bert.weights.hf import read_hf_config
    from hvd_bert.weights.portable import CONFIG_KEY, config_from_json, read_run_bert_config

    p = Path(path).expanduser()
    if is_hf_folder(p):
        return read_hf_config(p)[0]
    if google_checkpoint_prefix(p) is not None or is_nvidia_checkpoint(p):
        config = read_google_config(p if p.is_dir() else p.parent)  # (a published folder, or its prefix's)
        return dataclasses.replace(config, gelu="none") if is_nvidia_checkpoint(p) else config
    if p.suffix == ".npz" and p.is_file():
        try:
            with np.load(p, allow_pickle=False) as z:
                return config_from_json(z[CONFIG_KEY].tobytes(), str(p)) if CONFIG_KEY in z.files else None
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
            return None  # (the weights' reader names the damage)
    from hvd_bert.train.checkpoint import checkpoint_folder

    return read_run_bert_config(checkpoint_folder(p))


def read_published(path: Path, load_bin=None, read_google=None):
    """``(arrays, config)`` when ``path`` is a published checkpoint: a Hugging Face folder
    (``load_bin`` reads a ``pytorch_model.bin``) or a Google TF1 checkpoint (``read_google``,
    which needs TensorFlow); else None."""
    if is_hf_folder(path):
        return read_hf_folder(path, load_bin)
    if google_checkpoint_prefix(path) is not None:
        return read_google(path)
    if is_nvidia_checkpoint(path):
        return read_nvidia(path, load_bin)
    return None


def is_nvidia_checkpoint(path: Path) -> bool:
    """An NVIDIA DeepLearningExamples BERT checkpoint: a ``.pt`` holding ``{"model": state_dict}``
    with Hugging Face-style names, beside a Google-style ``bert_config.json``."""
    cfg = Path(path).parent / "bert_config.json"
    if not (Path(path).is_file() and Path(path).suffix in (".pt", ".pth") and cfg.is_file()):
        return False
    try:
        return "num_hidden_layers" in json.loads(cfg.read_text())  # hvd_bert's own says num_layers
    except (ValueError, RecursionError):
        return False


def read_nvidia(path: Path, load_bin) -> tuple[dict[str, np.ndarray], BertConfig]:
    """NVIDIA's PyTorch BERT computes GELU in the erf form (its ``gelu``/``bias_gelu``) and
    names the intermediate layer ``dense_act``; otherwise its names are Hugging Face's."""

    if load_bin is None:
        raise WeightsError(f"{path} is a PyTorch pickle: read it with PyTorch")
    config = dataclasses.replace(read_google_config(Path(path).parent), gelu="none")
    return hf_to_portable(load_bin(Path(path)), config, str(path)), config
