"""Google TF1 BERT checkpoints (``bert_config.json`` + ``bert_model.ckpt.{index,data-*}``):
read with TensorFlow's checkpoint reader, written with a TF1 ``Saver`` in a graph, so that
Google's ``modeling.py`` restores them. The names and layouts are in
``hvd_bert.weights.google``.

A checkpoint is read one variable at a time (:class:`ReaderTensors`). A PyTorch process reads
one through this module in its own process (``python -m hvd_bert.tf.google_ckpt to-safetensors
SRC OUT``: the portable weights streamed into a safetensors file, one tensor in memory at a time),
never importing TensorFlow itself, then reads that file lazily, a rank's share of each tensor.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.config.bert import BertConfig
from hvd_bert.weights.portable import WeightsError
from hvd_bert.weights.hf import new_folder, write_safetensors
from hvd_bert.weights.google import (google_checkpoint_prefix, google_config, google_to_portable,
                                           portable_to_google, read_google_config)

__all__ = ["ReaderTensors", "read_google", "write_google"]


class ReaderTensors(Mapping):
    """A TF checkpoint's variables through TensorFlow's reader, each read when asked for; a read
    that fails (a truncated data file) is a WeightsError naming the checkpoint."""

    def __init__(self, prefix: Path):
        self.prefix = prefix
        self.reader = self._call(lambda: tf.train.load_checkpoint(str(prefix)))
        self.shapes = {k: tuple(v) for k, v in self._call(self.reader.get_variable_to_shape_map).items()}

    def _call(self, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001  (the reader raises OpError, IndexError, ValueError, ...)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise WeightsError(f"cannot read the checkpoint {self.prefix}: {first}; the files are truncated "
                               f"or not a TensorFlow checkpoint: download them again") from None

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.shapes:
            raise KeyError(name)
        return self._call(lambda: self.reader.get_tensor(name))

    def shape_of(self, name: str) -> tuple:
        return self.shapes[name]

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def read_google(path: str | Path) -> tuple[Mapping[str, np.ndarray], BertConfig]:
    """The portable weights of a Google checkpoint, each variable read when it is used."""
    prefix = google_checkpoint_prefix(path)
    if prefix is None:
        raise WeightsError(f"{path} is not a Google BERT checkpoint (bert_config.json + *.ckpt.index)")
    config = read_google_config(prefix.parent)
    return google_to_portable(ReaderTensors(prefix), config, str(prefix)), config


def write_google(folder: str | Path, arrays: dict, config: BertConfig, vocab_file: str | Path | None = None,
                 name: str = "bert_model.ckpt", overwrite: bool = False) -> Path:
    """``folder/bert_config.json`` and ``folder/bert_model.ckpt.*`` (TF1 names), written into a
    temporary folder and renamed into place."""
    variables = portable_to_google(arrays, config)
    cfg = google_config(config)
    with new_folder(folder, overwrite) as tmp:
        with tf.Graph().as_default():
            v1 = tf.compat.v1
            tf_vars = {n: v1.get_variable(n, initializer=tf.constant(a), use_resource=False)
                       for n, a in variables.items()}
            saver = v1.train.Saver(var_list=tf_vars, write_version=v1.train.SaverDef.V2)
            with v1.Session() as sess:
                sess.run(v1.global_variables_initializer())
                saver.save(sess, str(tmp / name), write_meta_graph=False, write_state=False)
        (tmp / "bert_config.json").write_text(json.dumps(cfg, indent=2))
        if vocab_file is not None:
            shutil.copyfile(vocab_file, tmp / "vocab.txt")
    return Path(folder)


def main(argv: list[str]) -> int:
    """``to-safetensors SRC OUT``: a Google checkpoint's portable weights as a safetensors file,
    written one tensor at a time (what a PyTorch process runs)."""
    if len(argv) != 3 or argv[0] != "to-safetensors":
        print("usage: python -m hvd_bert.tf.google_ckpt to-safetensors SRC OUT", file=sys.stderr)
        return 2
    try:
        arrays, _ = read_google(argv[1])
        write_safetensors(Path(argv[2]), arrays, list(arrays), {"format": "hvd_bert portable weights"})
    except WeightsError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
