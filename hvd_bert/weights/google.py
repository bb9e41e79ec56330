"""Google's TF1 BERT checkpoints, framework-free part: which folder is one, its
``bert_config.json``, and the variable names and layouts (``bert/encoder/layer_N/attention/
self/query/kernel``, ``cls/predictions/...``, ``cls/seq_relationship/output_weights``) against
hvd_bert's portable names. Reading and writing the checkpoint files themselves needs
TensorFlow's checkpoint reader and a TF1 ``Saver``: ``hvd_bert.tf.google_ckpt``.

Google's ``modeling.gelu`` is the tanh approximation, so ``hidden_act: "gelu"`` in a Google
config means ``tanh`` here (in a Hugging Face config the same word means the erf form).
Dense kernels are ``[in, out]`` (PyTorch's ``[out, in]`` transposed); the next-sentence
``output_weights`` are ``[2, hidden]`` like PyTorch's weight.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

import numpy as np

from hvd_bert.config.bert import BertConfig
from hvd_bert.weights.portable import (VOCAB_ROWS, WeightsError, check_backbone, check_layer_count,
                                       check_values, pad_vocab_rows)

__all__ = ["google_checkpoint_prefix", "read_google_config", "google_config", "google_to_portable",
           "portable_to_google"]

_LN = {"weight": "gamma", "bias": "beta"}
_DENSE = {"weight": "kernel", "bias": "bias"}
_LAYER = {"query": "attention/self/query", "key": "attention/self/key",
          "value": "attention/self/value", "attention_output": "attention/output/dense",
          "attention_LayerNorm": "attention/output/LayerNorm", "intermediate": "intermediate/dense",
          "output": "output/dense", "output_LayerNorm": "output/LayerNorm"}
_FIXED = {  # portable -> (Google name, transpose)
    "embeddings.word_embeddings.weight": ("bert/embeddings/word_embeddings", False),
    "embeddings.position_embeddings.weight": ("bert/embeddings/position_embeddings", False),
    "embeddings.token_type_embeddings.weight": ("bert/embeddings/token_type_embeddings", False),
    "embeddings.LayerNorm.weight": ("bert/embeddings/LayerNorm/gamma", False),
    "embeddings.LayerNorm.bias": ("bert/embeddings/LayerNorm/beta", False),
    "pooler.weight": ("bert/pooler/dense/kernel", True), "pooler.bias": ("bert/pooler/dense/bias", False),
    "mlm_transform.weight": ("cls/predictions/transform/dense/kernel", True),
    "mlm_transform.bias": ("cls/predictions/transform/dense/bias", False),
    "mlm_LayerNorm.weight": ("cls/predictions/transform/LayerNorm/gamma", False),
    "mlm_LayerNorm.bias": ("cls/predictions/transform/LayerNorm/beta", False),
    "mlm_bias": ("cls/predictions/output_bias", False),
    "nsp.weight": ("cls/seq_relationship/output_weights", False),
    "nsp.bias": ("cls/seq_relationship/output_bias", False),
    "classifier.weight": ("output_weights", False), "classifier.bias": ("output_bias", False),
    "qa_outputs.weight": ("cls/squad/output_weights", False),  # run_squad's span head
    "qa_outputs.bias": ("cls/squad/output_bias", False),
}


def google_checkpoint_prefix(path: str | Path) -> Path | None:
    """The checkpoint prefix (``.../bert_model.ckpt``) when ``path`` is a Google BERT folder
    (``bert_config.json`` and one ``*.ckpt.index``) or such a prefix itself; else None."""
    p = Path(path)
    if p.is_dir() and (p / "bert_config.json").is_file():
        found = sorted(p.glob("*.ckpt.index")) or sorted(p.glob("*.ckpt-*.index"))
        return found[-1].with_suffix("") if found else None
    if p.with_name(p.name + ".index").is_file() and (p.parent / "bert_config.json").is_file():
        return p
    return None


def read_google_config(folder: str | Path) -> BertConfig:
    path = Path(folder) / "bert_config.json"
    try:
        raw = json.loads(path.read_text())
        act = raw.get("hidden_act", "gelu")
        if act not in ("gelu", "gelu_new"):
            raise WeightsError(f"{path}: hidden_act {act!r} is not supported (BERT uses gelu)")
        # Google's code: GELU in the tanh form, LayerNorm epsilon 1e-12 (contrib's layer_norm)
        return BertConfig.from_published(raw, gelu="tanh", layer_norm_eps=1e-12)
    except WeightsError:
        raise
    except (OSError, KeyError, ValueError, TypeError, AttributeError) as e:
        raise WeightsError(f"{path} is not a readable BERT config ({type(e).__name__}: {e})") from None


def google_config(config: BertConfig) -> dict:
    if config.gelu != "tanh":
        raise WeightsError("Google's BERT code computes GELU in its tanh form only; this model uses the "
                           "exact erf form, so a Google checkpoint of it would compute other outputs")
    return {"attention_probs_dropout_prob": config.attention_dropout, "hidden_act": "gelu",
            "hidden_dropout_prob": config.hidden_dropout, "hidden_size": config.hidden_size,
            "initializer_range": config.initializer_range, "intermediate_size": config.intermediate_size,
            "max_position_embeddings": config.max_position_embeddings,
            "num_attention_heads": config.num_heads, "num_hidden_layers": config.num_layers,
            "type_vocab_size": config.type_vocab_size, "vocab_size": config.vocab_size}


def _names(config: BertConfig) -> dict[str, tuple[str, bool]]:
    out = dict(_FIXED)
    for i in range(config.num_layers):
        for ours, theirs in _LAYER.items():
            leaves = _LN if ours.endswith("LayerNorm") else _DENSE
            for leaf, g in leaves.items():
                out[f"layers.{i}.{ours}.{leaf}"] = (f"bert/encoder/layer_{i}/{theirs}/{g}", leaf == "weight"
                                                    and not ours.endswith("LayerNorm"))
    return out


def google_to_portable(variables: Mapping[str, np.ndarray], config: BertConfig, source: str) -> Mapping:
    """Google variable names -> portable names (optimizer slots and step counters ignored). Lazy
    ``variables`` (TensorFlow's checkpoint reader) give a lazy mapping (``weights.lazy.View``):
    names and shapes checked now, each tensor read, checked and transposed when it is used."""
    names = {ours: spec for ours, spec in _names(config).items() if spec[0] in variables}
    known = {t for t, _ in _names(config).values()}
    unknown = sorted(k for k in variables if k not in known and not re.search(r"(adam_[mv]|global_step|"
                                                                             r"Momentum|LAMB)", k))
    check_layer_count(unknown, config, source, "bert_config.json")
    if unknown:
        raise WeightsError(f"{source} has variables hvd_bert's BERT does not know: {unknown[:6]}")

    def fix(ours: str, a: np.ndarray) -> np.ndarray:
        theirs, transpose = names[ours]
        a = check_values(theirs, a, source).astype(np.float32, copy=False)
        return np.ascontiguousarray(a.T) if transpose else a

    if not hasattr(variables, "shape_of"):  # (a dict in memory: converted now)
        out = {ours: fix(ours, variables[theirs]) for ours, (theirs, _) in names.items()}
        check_backbone(out, config, source, "bert_config.json")
        return pad_vocab_rows(out, config, source, "bert_config.json")
    from hvd_bert.weights.lazy import View
    from hvd_bert.weights.portable import shape_of

    for name in VOCAB_ROWS:  # (pad_vocab_rows' check, on the shapes)
        if name in names and shape_of(variables, names[name][0])[0] != config.vocab_size:
            raise WeightsError(f"{source}: {name} has {shape_of(variables, names[name][0])[0]} rows, "
                               f"bert_config.json's vocab_size is {config.vocab_size}")

    def padded(ours: str, a: np.ndarray) -> np.ndarray:
        a = fix(ours, a)
        return pad_vocab_rows({ours: a}, config, source, "bert_config.json")[ours] if ours in VOCAB_ROWS \
            else a

    def shape(ours: str, s: tuple) -> tuple:
        s = tuple(s[::-1]) if names[ours][1] else tuple(s)
        return (config.padded_vocab_size, *s[1:]) if ours in VOCAB_ROWS else s

    out = View(variables, {ours: theirs for ours, (theirs, _) in names.items()}, padded, shape,
               whole_only=VOCAB_ROWS, transposed=frozenset(o for o, (_, t) in names.items() if t))
    check_backbone(out, config, source, "bert_config.json")
    return out


def portable_to_google(arrays: Mapping[str, np.ndarray], config: BertConfig) -> dict[str, np.ndarray]:
    names = _names(config)
    out = {}
    for ours, a in arrays.items():
        if ours not in names:
            raise WeightsError(f"portable weight {ours!r} has no Google name")
        theirs, transpose = names[ours]
        a = np.asarray(a, dtype=np.float32)
        if ours in VOCAB_ROWS:
            a = a[: config.vocab_size]
        out[theirs] = np.ascontiguousarray(a.T) if transpose else a
    return out
