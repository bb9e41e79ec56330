"""Hugging Face BERT checkpoints, framework-free: a model folder (``config.json`` plus
``model.safetensors`` or ``pytorch_model.bin``) read into hvd_bert's portable weights
(``weights.portable``: PyTorch ``state_dict`` names of ``hvd_bert.pt.models.bert``) and
written back, so that ``transformers.BertForPreTraining.from_pretrained(DIR)`` loads it with
no missing or unexpected weights.

Layouts read: ``BertForPreTraining``, ``BertForMaskedLM``, ``BertModel`` (no ``bert.``
prefix, no heads) and ``BertForSequenceClassification``. The activation comes from
``hidden_act``: ``gelu`` is the exact erf form, ``gelu_new`` / ``gelu_pytorch_tanh`` the
tanh approximation. The vocabulary keeps its size in the file; inside the model it is padded
to a multiple of 8 (zero rows), and cut back on writing.

Safetensors files are read with the ``safetensors`` library's numpy API; ``pytorch_model.bin``
needs a loader (``load_bin``) from the caller, PyTorch's with ``weights_only=True``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from hvd_bert.config.bert import BertConfig
from hvd_bert.files import atomic_folder, usual_mode
from hvd_bert.weights.portable import (VOCAB_ROWS, WeightsError, check_backbone, check_layer_count,
                                       check_values, pad_vocab_rows, shape_of)

__all__ = ["is_hf_folder", "read_hf_config", "read_hf_folder", "hf_to_portable", "portable_to_hf",
           "write_hf_folder", "write_safetensors", "new_folder", "HF_WEIGHTS"]

HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}

# portable name <- HF name (without the "bert." prefix), per layer where N is the layer index
_EMB = {"embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight": "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight": "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias": "embeddings.LayerNorm.bias",
        "pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}
_LAYER = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
          "attention_output": "attention.output.dense", "attention_LayerNorm": "attention.output.LayerNorm",
          "intermediate": "intermediate.dense", "output": "output.dense",
          "output_LayerNorm": "output.LayerNorm"}
_HEADS = {"mlm_transform.weight": "cls.predictions.transform.dense.weight",
          "mlm_transform.bias": "cls.predictions.transform.dense.bias",
          "mlm_LayerNorm.weight": "cls.predictions.transform.LayerNorm.weight",
          "mlm_LayerNorm.bias": "cls.predictions.transform.LayerNorm.bias",
          "mlm_bias": "cls.predictions.bias",
          "nsp.weight": "cls.seq_relationship.weight", "nsp.bias": "cls.seq_relationship.bias",
          "classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias",
          "qa_outputs.weight": "qa_outputs.weight", "qa_outputs.bias": "qa_outputs.bias"}


def is_hf_folder(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file() and any((p / w).is_file() for w in HF_WEIGHTS)


def read_hf_config(folder: str | Path) -> tuple[BertConfig, dict]:
    """``(BertConfig, the raw config.json)`` of a Hugging Face BERT folder."""
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
    except (OSError, ValueError, RecursionError) as e:
        raise WeightsError(f"{path} is not a readable JSON config ({e}); give a Hugging Face model folder "
                           f"written by save_pretrained") from None
    if raw.get("model_type", "bert") != "bert":
        raise WeightsError(f"{path} describes a {raw.get('model_type')!r} model; hvd_bert reads BERT "
                           f"checkpoints (model_type 'bert')")
    act = raw.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise WeightsError(f"{path}: hidden_act {act!r} is not supported; BERT uses gelu (erf) or "
                           f"gelu_new (tanh): {', '.join(ACTIVATIONS)}")
    try:
        config = BertConfig.from_published(raw, gelu=ACTIVATIONS[act])
    except KeyError as e:
        raise WeightsError(f"{path} has no {e.args[0]!r}; is it a BERT config?") from None
    except (ValueError, TypeError) as e:
        raise WeightsError(f"{path}: {e}") from None
    return config, raw


def _read_tensors(folder: Path, load_bin: Callable[[Path], Mapping[str, np.ndarray]] | None) -> dict:
    st = folder / "model.safetensors"
    if st.is_file():  # (each tensor, or a rank's share of it, read when it is used)
        from safetensors import SafetensorError

        from hvd_bert.weights.lazy import SafetensorsTensors

        try:
            tensors = SafetensorsTensors(st)
        except (SafetensorError, OSError, ValueError) as e:
            raise WeightsError(f"{st} cannot be read ({e}): the file is truncated or not safetensors; "
                               f"download or save it again") from None
        odd = tensors.unreadable()
        if odd:
            raise WeightsError(f"{st} stores {odd[:3]} as {tensors.entries[odd[0]]['dtype']}, which numpy "
                               f"cannot hold: save the model as float32 (model.float().save_pretrained(DIR))")
        return tensors
    binary = folder / "pytorch_model.bin"
    if load_bin is None:
        raise WeightsError(f"{binary}: reading pytorch_model.bin needs PyTorch; convert it once with "
                           f"`hvd-bert convert {folder} --output w.npz` (or save it as safetensors)")
    return dict(load_bin(binary))


def hf_to_portable(state: Mapping[str, np.ndarray], config: BertConfig,
                   source: str) -> Mapping[str, np.ndarray]:
    """HF parameter names -> portable names; the vocabulary rows padded to a multiple of 8. A lazy
    ``state`` (a safetensors file) gives a lazy mapping: names and shapes are checked now, each
    tensor's values when it is read (or only a rank's share of it, ``weights.lazy``)."""
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    names: dict[str, str] = {}  # portable <- HF

    def take(portable: str, hf: str) -> None:
        # older checkpoints name LayerNorm parameters gamma/beta
        old = hf.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        nvidia = hf.replace("intermediate.dense.", "intermediate.dense_act.")  # NVIDIA's name for it
        for name in (hf, old, nvidia):
            if name in state:
                names[portable] = name
                return

    for portable, hf in _EMB.items():
        take(portable, prefix + hf)
    for i in range(config.num_layers):
        for ours, theirs in _LAYER.items():
            for leaf in ("weight", "bias"):
                take(f"layers.{i}.{ours}.{leaf}", f"{prefix}encoder.layer.{i}.{theirs}.{leaf}")
    for portable, hf in _HEADS.items():
        take(portable, hf)
    if "mlm_bias" not in names and "cls.predictions.decoder.bias" in state:
        take("mlm_bias", "cls.predictions.decoder.bias")
    used = set(names.values()) | {k for k in state if k in ("cls.predictions.decoder.weight",
                                                               "cls.predictions.decoder.bias")
                                  or k.endswith("position_ids")}
    unknown = sorted(k for k in state if k not in used)
    check_layer_count(unknown, config, source, "config.json")
    if unknown:
        raise WeightsError(f"{source} has parameters hvd_bert's BERT does not know: {unknown[:6]}"
                           f"{' ...' if len(unknown) > 6 else ''}; is it a BERT checkpoint?")
    if not hasattr(state, "shape_of"):  # (a dict in memory: converted now)
        out = {p: check_values(h, state[h], source).astype(np.float32) for p, h in names.items()}
        check_backbone(out, config, source, "config.json")
        return pad_vocab_rows(out, config, source, "config.json")
    from hvd_bert.weights.lazy import View

    for name in VOCAB_ROWS:  # (pad_vocab_rows' check, on the shapes)
        if name in names and shape_of(state, names[name])[0] != config.vocab_size:
            raise WeightsError(f"{source}: {name} has {shape_of(state, names[name])[0]} rows, config.json's "
                               f"vocab_size is {config.vocab_size}")

    def fix(name: str, a: np.ndarray) -> np.ndarray:
        a = check_values(names[name], a, source).astype(np.float32, copy=False)  # (a copy already)
        return pad_vocab_rows({name: a}, config, source, "config.json")[name] if name in VOCAB_ROWS else a

    def shape(name: str, s: tuple) -> tuple:
        return (config.padded_vocab_size, *s[1:]) if name in VOCAB_ROWS else s

    out = View(state, names, fix, shape, whole_only=VOCAB_ROWS)
    check_backbone(out, config, source, "config.json")
    return out


def read_hf_folder(folder: str | Path, load_bin=None) -> tuple[dict[str, np.ndarray], BertConfig]:
    """Portable weights and the config of a Hugging Face BERT folder."""
    folder = Path(folder)
    config, _ = read_hf_config(folder)
    return hf_to_portable(_read_tensors(folder, load_bin), config, str(folder)), config


def portable_to_hf(arrays: Mapping[str, np.ndarray], config: BertConfig) -> Mapping[str, np.ndarray]:
    """Portable weights -> the ``state_dict`` of ``transformers.BertForPreTraining`` (or
    ``BertForSequenceClassification`` when the weights hold a classifier), vocabulary cut back
    to ``config.vocab_size``, the tied decoder written out as HF does. A mapping that reads each
    tensor of ``arrays`` when it is asked for (a lazy ``arrays`` streams)."""
    inverse = {**_EMB, **{k: v for k, v in _HEADS.items()}}
    names = {}
    for name in arrays:
        m = re.match(r"^layers\.(\d+)\.(\w+)\.(weight|bias)$", name)
        if m:
            hf = f"bert.encoder.layer.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
        elif name in _EMB:
            hf = "bert." + inverse[name]
        elif name in _HEADS:
            hf = inverse[name]
        else:
            raise WeightsError(f"portable weight {name!r} has no Hugging Face name")
        names[hf] = name
    if "cls.predictions.bias" in names:
        names["cls.predictions.decoder.weight"] = names["bert.embeddings.word_embeddings.weight"]
        names["cls.predictions.decoder.bias"] = names["cls.predictions.bias"]
    return _Renamed(arrays, names, config.vocab_size)


class _Renamed(Mapping):
    """``{Hugging Face name: array}`` over portable ``arrays``, each read and converted on access."""

    def __init__(self, arrays: Mapping, names: dict[str, str], vocab_size: int):
        self.arrays, self.names, self.vocab_size = arrays, names, vocab_size

    def __getitem__(self, hf: str) -> np.ndarray:
        name = self.names[hf]
        a = np.ascontiguousarray(self.arrays[name], dtype=np.float32)
        return a[: self.vocab_size] if name in VOCAB_ROWS else a

    def shape_of(self, hf: str) -> tuple:
        name = self.names[hf]
        shape = shape_of(self.arrays, name)
        return (min(shape[0], self.vocab_size), *shape[1:]) if name in VOCAB_ROWS else shape

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def write_safetensors(path: Path, state: Mapping[str, np.ndarray], names: list[str], metadata: dict) -> None:
    """``names`` of ``state`` as a safetensors file (float32), one tensor at a time: the header
    from the shapes, then each tensor's bytes as it is read (safetensors' own writer takes every
    tensor at once). The layout is the format's: an 8-byte little-endian header length, the JSON
    header padded with spaces to 8 bytes, the data in the header's order."""
    header, offset = {"__metadata__": metadata}, 0
    for name in names:
        shape = shape_of(state, name)
        size = int(np.prod(shape, dtype=np.int64)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name in names:
            a = np.asarray(state[name], dtype="<f4")
            if tuple(a.shape) != tuple(header[name]["shape"]):
                raise WeightsError(f"{name} has shape {a.shape}, {header[name]['shape']} was announced")
            f.write(memoryview(np.ascontiguousarray(a.reshape(-1))).cast("B"))


def hf_config(config: BertConfig, architecture: str, num_labels: int | None = None,
              labels: list[str] | None = None) -> dict:
    """A Hugging Face ``config.json`` for ``config``; a classifier's ``id2label`` / ``label2id``
    from ``labels`` (the fine-tuning data's names, in the classifier's order) when given."""
    act = "gelu" if config.gelu == "none" else "gelu_new"
    out = {"architectures": [architecture], "model_type": "bert", "vocab_size": config.vocab_size,
           "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
           "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
           "hidden_act": act, "max_position_embeddings": config.max_position_embeddings,
           "type_vocab_size": config.type_vocab_size, "hidden_dropout_prob": config.hidden_dropout,
           "attention_probs_dropout_prob": config.attention_dropout,
           "initializer_range": config.initializer_range, "layer_norm_eps": config.layer_norm_eps,
           "pad_token_id": 0, "tie_word_embeddings": True}
    if num_labels is not None:
        out["num_labels"] = num_labels
        names = list(labels) if labels and len(labels) == num_labels else \
            [f"LABEL_{i}" for i in range(num_labels)]
        out["id2label"] = {str(i): name for i, name in enumerate(names)}
        out["label2id"] = {name: i for i, name in enumerate(names)}
    return out


def write_hf_folder(folder: str | Path, arrays: Mapping[str, np.ndarray], config: BertConfig,
                    vocab_file: str | Path | None = None, do_lower_case: bool = True,
                    labels: list[str] | None = None, overwrite: bool = False,
                    task: str | None = None) -> Path:
    """A Hugging Face model folder (``config.json``, ``model.safetensors``, and the tokenizer
    files when ``vocab_file`` is given), written to a temporary folder and renamed into place;
    a classifier's ``labels`` become its ``id2label``. A classifier without a pooler (or one whose
    ``task`` says so) labels every token: ``BertForTokenClassification``."""
    import shutil

    state = portable_to_hf(arrays, config)
    classifier = "classifier.weight" in state
    tokens = classifier and (task == "token-classification" or not any("pooler" in k for k in state))
    arch = ("BertForTokenClassification" if tokens else "BertForSequenceClassification" if classifier else
            "BertForQuestionAnswering" if "qa_outputs.weight" in state else "BertForPreTraining")
    names = [k for k in state if arch == "BertForPreTraining" or not k.startswith("cls.")]  # (fine-tuned:
    num_labels = int(shape_of(state, "classifier.weight")[0]) if classifier else None  # no pretraining heads)
    if labels and num_labels is not None and len(labels) != num_labels:
        raise WeightsError(f"the run's task.json names {len(labels)} labels {list(labels)[:6]}, its "
                           f"classifier has {num_labels} outputs: they do not belong together; restore "
                           f"task.json from the run that trained this head (nothing was written)")
    with new_folder(folder, overwrite) as tmp:
        write_safetensors(tmp / "model.safetensors", state, names, metadata={"format": "pt"})
        usual_mode(tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(hf_config(config, arch, num_labels, labels), indent=2))
        if vocab_file is not None:
            shutil.copyfile(vocab_file, tmp / "vocab.txt")
            (tmp / "tokenizer_config.json").write_text(json.dumps(
                {"tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case,
                 "model_max_length": config.max_position_embeddings}, indent=2))
    return Path(folder)


def new_folder(folder: str | Path, overwrite: bool = False):
    """:func:`hvd_bert.files.atomic_folder`, an existing folder a WeightsError (unless ``overwrite``)."""
    return atomic_folder(folder, exists_error=WeightsError, overwrite=overwrite)
