"""Google TF1 BERT checkpoints (``bert_config.json`` + ``bert_model.ckpt.{index,data-*}``):
read with TensorFlow's checkpoint reader, written with a TF1 ``Saver`` in a graph, so that
Google's ``modeling.py`` restores them. The names and layouts are in
``hvd_bert.weights.google``.

A PyTorch process reads such a checkpoint through this module in its own process
(``python -m hvd_bert.tf.google_ckpt to-npz SRC OUT.npz``), never importing TensorFlow itself.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from hvd_bert.config.bert import BertConfig
from hvd_bert.weights.portable import WeightsError, save_weights
from hvd_bert.weights.hf import new_folder
from hvd_bert.weights.google import (google_checkpoint_prefix, google_config, google_to_portable,
                                           portable_to_google, read_google_config)

__all__ = ["read_google", "write_google"]


def read_google(path: str | Path) -> tuple[dict[str, np.ndarray], BertConfig]:
    prefix = google_checkpoint_prefix(path)
    if prefix is None:
        raise WeightsError(f"{path} is not a Google BERT checkpoint (bert_config.json + *.ckpt.index)")
    config = read_google_config(prefix.parent)
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        variables = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    except Exception as e:  # noqa: BLE001  (the reader raises OpError, IndexError, ValueError, ...)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise WeightsError(f"cannot read the checkpoint {prefix}: {first}; the files are truncated or not "
                           f"a TensorFlow checkpoint: download them again") from None
    return google_to_portable(variables, config, str(prefix)), config


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
    """``to-npz SRC OUT``: a Google checkpoint as a portable .npz (what a PyTorch process runs)."""
    if len(argv) != 3 or argv[0] != "to-npz":
        print("usage: python -m hvd_bert.tf.google_ckpt to-npz SRC OUT.npz", file=sys.stderr)
        return 2
    try:
        arrays, config = read_google(argv[1])
        save_weights(argv[2], arrays, config)
    except WeightsError as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
