"""``hvd-bert convert``: a checkpoint of either framework, a portable ``.npz`` or a published
checkpoint, read by the framework it needs, written as portable weights (``.npz``), a Hugging
Face folder (``--to hf``) or a Google TF1 checkpoint (``--to google``). Which framework reads
a path is decided here: its suffix, or a run folder's checkpoints."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

from hvd_bert.files import OutputClash, read_json_object, refuse_clash
from hvd_bert.train.checkpoint import (SHARDED, checkpoint_folder, latest_checkpoint, pick_checkpoint,
                                      run_folder_of)
from hvd_bert.train.run_folder import refuse_run_files
from hvd_bert.weights.hf import is_hf_folder, write_hf_folder
from hvd_bert.weights.portable import WeightsError, check_backbone, save_weights, shape_of

__all__ = ["reading_framework", "vocab_of", "convert", "data_folder_of"]


def reading_framework(src: Path, framework: str = "auto") -> str:
    """``pt`` or ``tf``: the framework that reads ``src`` (PyTorch's reader also reads .npz and
    published checkpoints); a checkpoint of the other framework than the one asked is an error."""
    if framework == "auto":
        tf_only = src.is_dir() and not is_hf_folder(src) and latest_checkpoint(src, "tf") and \
            not latest_checkpoint(src, ("pt", SHARDED))
        framework = "tf" if src.suffix == ".tf" or tf_only else "pt"
    # (a sharded checkpoint, of either framework, holds portable names: PyTorch's reader reads it)
    kind = {".pt": "pt", ".tf": "tf", f".{SHARDED}": "pt"}.get(src.suffix)
    if kind and kind != framework:
        raise WeightsError(f"{src} is a {'PyTorch' if kind == 'pt' else 'TensorFlow'} checkpoint; use "
                           f"--framework {kind} (or leave it out)")
    return framework


def data_folder_of(path: Path | None) -> Path | None:
    """The prepared data folder (it holds dataset.json) a file such as a vocabulary lies in, or None."""
    if path is None:
        return None
    folder = Path(path).expanduser().parent
    return folder if (folder / "dataset.json").is_file() else None


def vocab_of(src: Path) -> Path | None:
    """The vocab.txt that goes with a checkpoint: a Hugging Face folder's own, or the one of the
    data a run folder trained on (its config.json names the data)."""
    folder = checkpoint_folder(src)  # (a checkpoint file or a ckpt-*.shards folder: its run folder's)
    if (folder / "vocab.txt").is_file():
        return folder / "vocab.txt"
    cfg = folder / "config.json"
    try:
        data = read_json_object(cfg).get("data") if cfg.is_file() else None
    except (OSError, ValueError):
        data = None
    if isinstance(data, str) and data and (Path(data).expanduser() / "vocab.txt").is_file():
        return Path(data).expanduser() / "vocab.txt"
    return None


def refuse_run_output(output: str | Path, overwrite: bool) -> None:
    """A run's files are never an export's place (``train.run_folder.refuse_run_files``), and an
    existing output is replaced only with ``--overwrite``."""
    out = Path(output).expanduser()
    refuse_run_files(out, "convert")
    if (out / "dataset.json").is_file() or data_folder_of(out) is not None and out.exists():
        raise OutputClash(errno.EEXIST, f"--output {out} is prepared data (its dataset.json is there): "
                                        f"convert never replaces prepared data, --overwrite or not; give "
                                        f"--output a path outside it", str(out))
    if not overwrite and (out.is_file() or out.is_symlink()):
        raise OutputClash(errno.EEXIST, f"--output {out} exists: give --overwrite to replace it (once the "
                                        f"new file is complete), or another --output", str(out))


def convert(checkpoint: str | Path, output: str | Path, *, to: str = "npz", framework: str = "auto",
            vocab: str | Path | None = None, cased: bool = False, pick: str = "best",
            overwrite: bool = False) -> str:
    """Convert ``checkpoint`` to ``output`` (see the module docstring; a run folder: its best
    model, else its newest checkpoint, ``pick``); returns the line that says what was written
    and how to load it."""
    from hvd_bert.train.backend import get_backend

    src = Path(checkpoint).expanduser()
    if not src.exists():
        raise WeightsError(f"{src} does not exist; give a run folder, a ckpt-*.pt / ckpt-*.tf, a .npz or a "
                           f"Hugging Face model folder")
    refuse_clash(output, {"the checkpoint": src, "the checkpoint's folder": run_folder_of(src),
                          "the vocabulary": vocab}, folder=to != "npz")
    picked, what = pick_checkpoint(src, pick)
    framework = reading_framework(picked if what else src, framework)
    src = picked if what else src
    which = f" ({what})" if what else ""
    own = vocab_of(src)
    given = Path(vocab).expanduser() if vocab else None
    vocab = given or own
    # again with what the run folder resolved to (the checkpoint picked, the vocabulary and the data
    # folder it lives in): --overwrite must never replace what this command reads
    refuse_clash(output, {"the checkpoint": src, "the vocabulary": vocab,
                          "the data folder of the vocabulary": data_folder_of(vocab)}, folder=to != "npz")
    refuse_run_output(output, overwrite)  # (nor another run's files, nor an existing file unasked)
    arrays, config = get_backend(framework).read_checkpoint_weights(src)
    if config is None:
        raise WeightsError(f"no bert_config.json beside {src}: it is written into every run folder by "
                           f"hvd-bert pretrain / finetune")
    # every encoder tensor the config names, of its shape, before anything is written (a checkpoint
    # whose index lost or reshaped a tensor would export a model missing it)
    check_backbone(arrays, config, str(src), "its run's bert_config.json")
    # (a sharded checkpoint's tensors are read one at a time, as they are written: counted by shape)
    n = f"{len(arrays)} tensors, {sum(math.prod(shape_of(arrays, k)) for k in arrays) / 1e6:.1f}M parameters"
    if to in ("hf", "google") and vocab is None:  # (an export without its vocabulary is not a model)
        where = ("neither its run folder nor the data its config.json names holds one" if run_folder_of(src)
                 else "a weights file alone carries none")
        raise WeightsError(f"no vocab.txt for {src}: {where}; give the vocabulary it was trained with: "
                           f"--vocab FILE (nothing was written)")
    if to in ("hf", "google"):  # (one token per row of the embeddings: another vocabulary is another model)
        from hvd_bert.data.records import DatasetError
        from hvd_bert.data.vocab import vocab_tokens

        try:
            tokens = len(vocab_tokens(vocab))
        except (DatasetError, OSError) as e:
            raise WeightsError(f"{e} (nothing was written)") from None
        if tokens != config.vocab_size:
            raise WeightsError(f"the vocabulary {vocab} has {tokens} tokens, the model {config.vocab_size} "
                               f"(its word embeddings' rows): give the vocab.txt it was trained with: "
                               f"--vocab FILE (nothing was written)")
        from hvd_bert.data.sidecar import file_sha256  # (the same size in another order: wrong tokens)

        if given is not None and own is not None and file_sha256(given) != file_sha256(own):
            raise WeightsError(f"--vocab {given} is not the vocabulary {src} was trained with ({own}): an "
                               f"export with it would map its tokens to other rows; drop --vocab to take "
                               f"{own} (nothing was written)")
    if to == "google":
        from hvd_bert.tf.google_ckpt import write_google  # TensorFlow writes TF1 checkpoints

        out = write_google(output, arrays, config, vocab_file=vocab, overwrite=overwrite)
        return (f"{src} ({n}) -> {out} (Google TF1: bert_config.json + bert_model.ckpt, as modeling.py reads)"
                f"{which}")
    if to == "hf":
        from hvd_bert.data.finetune import read_task_record

        task = read_task_record(src) or {}
        out = write_hf_folder(output, arrays, config, vocab_file=vocab, do_lower_case=not cased,
                              labels=task.get("labels"), overwrite=overwrite, task=task.get("task"))
        arch = json.loads((out / "config.json").read_text())["architectures"][0]  # the class to load it with
        return (f"{src} ({n}) -> {out} (Hugging Face: transformers.{arch}.from_pretrained({str(out)!r}))"
                f"{which}")
    out = save_weights(output, arrays, config)
    return (f"{src} ({framework}, {n}) -> {out}; load it with --set init_checkpoint={out} in either framework"
            f"{which}")
