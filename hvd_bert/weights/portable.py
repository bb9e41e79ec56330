"""BERT weights in a framework-neutral file, so a checkpoint moves between PyTorch and
TensorFlow.

A portable weights file is an ``.npz`` archive: one array per parameter under the PyTorch
model's ``state_dict`` names and layouts (``nn.Linear`` weights are ``[out, in]``), plus the
model's :class:`BertConfig` as JSON under ``__bert_config__``. Each frontend maps its own
variables to these names (``hvd_bert.pt.models.bert.export_weights`` / ``load_weights``, and the
same in ``hvd_bert.tf.models.bert``); ``hvd-bert convert`` writes one from either framework's
checkpoint. Loading checks every name and shape and says which do not fit; the position
embeddings may grow (phase 1 at 128 tokens to phase 2 at 512 keeps the rows it has).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping

import zipfile

import numpy as np

from hvd_bert.config.bert import BertConfig
from hvd_bert.files import atomic_write
from hvd_bert.weights.lazy import read_share, shape_of

__all__ = ["shape_of", "untrained_head", "WeightsError", "save_weights", "write_run_bert_config",
           "read_run_bert_config",
           "read_weights", "fit_weights", "Fitted", "fit_for_model", "POSITION_EMBEDDINGS",
           "ENCODER_PREFIXES", "check_values", "check_backbone", "check_layer_count", "backbone_shapes",
           "config_from_json"]

CONFIG_KEY = "__bert_config__"
POSITION_EMBEDDINGS = "embeddings.position_embeddings.weight"
# the parameters a fine-tuning model takes from a pretrained one (not the pretraining heads)
ENCODER_PREFIXES = ("embeddings.", "layers.", "pooler.")


class WeightsError(ValueError):
    """A weights file that does not fit the model it is loaded into."""


def config_from_json(text: str | bytes, source: str) -> BertConfig:
    """A :class:`BertConfig` from hvd_bert's own JSON (``bert_config.json``, an .npz's embedded
    one), every field checked; a WeightsError naming ``source`` otherwise."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
        return BertConfig(**raw)
    except TypeError as e:
        raise WeightsError(f"{source}'s BERT config has a key hvd_bert does not know ({e}); write it again "
                           f"with hvd-bert convert") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise WeightsError(f"{source}'s BERT config is damaged ({e}); write it again with hvd-bert "
                           f"convert") from None


def check_values(name: str, a, source: str) -> np.ndarray:
    """A parameter read from a file: stored as floating point (an integer dtype of the same
    byte size would turn into nonsense values) and finite everywhere."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating) and a.dtype.name != "bfloat16":
        raise WeightsError(f"{source}: {name} is stored as {a.dtype}; BERT's weights are floating point: "
                           f"the file is damaged or was written wrongly, save it again")
    if not np.isfinite(a).all():
        raise WeightsError(f"{source}: {name} holds NaN or infinite values: the checkpoint is damaged or "
                           f"comes from a diverged run; use an earlier one")
    return a


def backbone_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """The encoder's portable names and shapes (the vocabulary rows unpadded; the pooler, which
    a SQuAD model lacks, left out)."""
    h, i = config.hidden_size, config.intermediate_size
    out = {"embeddings.word_embeddings.weight": (config.vocab_size, h),
           POSITION_EMBEDDINGS: (config.max_position_embeddings, h),
           "embeddings.token_type_embeddings.weight": (config.type_vocab_size, h),
           "embeddings.LayerNorm.weight": (h,), "embeddings.LayerNorm.bias": (h,)}
    for n in range(config.num_layers):
        for part, (rows, cols) in (("query", (h, h)), ("key", (h, h)), ("value", (h, h)),
                                   ("attention_output", (h, h)), ("intermediate", (i, h)),
                                   ("output", (h, i))):
            out[f"layers.{n}.{part}.weight"], out[f"layers.{n}.{part}.bias"] = (rows, cols), (rows,)
        for norm in ("attention_LayerNorm", "output_LayerNorm"):
            out[f"layers.{n}.{norm}.weight"] = out[f"layers.{n}.{norm}.bias"] = (h,)
    return out


def check_layer_count(names, config: BertConfig, source: str, config_file: str) -> None:
    """A file whose encoder has more layers than its config says (their names are a published
    format's: ``encoder.layer.N.`` or ``encoder/layer_N/``) is refused as a config that does not
    match, not as parameters of another model."""
    import re

    from hvd_bert.core.text import plural

    found = [int(m.group(1)) for n in names for m in [re.search(r"encoder[./]layer[._](\d+)[./]", n)] if m]
    if found and max(found) >= config.num_layers:
        layers = plural(config.num_layers, "layer")
        raise WeightsError(f"{source} does not match {config_file} ({layers}; the file has layers "
                           f"0..{max(found)}). Give the {config_file} that was saved with these weights")


def check_backbone(arrays: Mapping[str, np.ndarray], config: BertConfig, source: str,
                   config_file: str) -> None:
    """A published checkpoint's encoder against its own config: every parameter there, each of
    the config's shape (a config that disagrees with the weights would build another model), and
    the pooler and pretraining heads of the config's shapes where the file has them."""
    layers = sorted({int(k.split(".")[1]) for k in arrays if k.startswith("layers.")})
    expected = backbone_shapes(config)
    missing = [k for k in expected if k not in arrays]
    h = config.hidden_size
    padded = {"embeddings.word_embeddings.weight": (config.padded_vocab_size, h),
              "mlm_bias": (config.padded_vocab_size,)}
    # the pooler and the pretraining heads, where the file has them
    heads = {"pooler.weight": (h, h), "pooler.bias": (h,), "mlm_transform.weight": (h, h),
             "mlm_transform.bias": (h,), "mlm_LayerNorm.weight": (h,), "mlm_LayerNorm.bias": (h,),
             "mlm_bias": (config.vocab_size,), "nsp.weight": (2, h), "nsp.bias": (2,)}
    # (a lazy mapping's shapes: nothing read)
    wrong = [f"{k}: {shape_of(arrays, k)}, config {s}" for k, s in {**expected, **heads}.items()
             if k in arrays and shape_of(arrays, k) not in (s, padded.get(k))]
    if missing or wrong:
        have = f"layers 0..{layers[-1]}" if layers else "no layers"
        detail = (f"missing {missing[:3]}{' ...' if len(missing) > 3 else ''}" if missing else
                  f"shapes {wrong[:3]}")
        raise WeightsError(f"{source} does not match {config_file} ({config.num_layers} layers, hidden size "
                           f"{config.hidden_size}; the file has {have}): {detail}. Give the config.json "
                           f"that was saved with these weights")




def save_weights(path: str | Path, arrays: Mapping[str, np.ndarray], config: BertConfig) -> Path:
    """Write ``arrays`` and ``config`` to ``path`` (``.npz``, as ``np.savez`` writes it) atomically,
    one array at a time: a lazy mapping (a sharded checkpoint's tensors) is read as it is written,
    in memory bounded by its largest tensor."""
    meta = np.frombuffer(json.dumps(dataclasses.asdict(config)).encode(), dtype=np.uint8)

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name in [*arrays, CONFIG_KEY]:
                with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                    value = meta if name == CONFIG_KEY else np.asanyarray(arrays[name])
                    np.lib.format.write_array(member, value, allow_pickle=False)

    return atomic_write(path, write)


def write_run_bert_config(folder: str | Path, config: BertConfig) -> Path:
    """``folder/bert_config.json``: a run's model, so its checkpoints can be converted."""
    text = json.dumps(dataclasses.asdict(config), indent=1)
    return atomic_write(Path(folder) / "bert_config.json", lambda tmp: tmp.write_text(text))


def read_run_bert_config(folder: str | Path) -> BertConfig | None:
    p = Path(folder) / "bert_config.json"
    return config_from_json(p.read_bytes(), str(p)) if p.is_file() else None


def _npz_damage(path: Path) -> str | None:
    """What is wrong with an ``.npz``'s members before any is loaded: each member's ``.npy``
    header must claim exactly the bytes the member holds (a header claiming 1e11 values would
    otherwise be allocated); None when every one does."""
    import math

    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with z.open(info) as f:
                major, _ = np.lib.format.read_magic(f)
                fmt = np.lib.format
                shape, _, dtype = (fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0)(f)
                claimed = math.prod(shape) * dtype.itemsize
                if dtype.hasobject:
                    return f"its member {info.filename} holds Python objects (a pickle), never loaded here"
                if claimed != info.file_size - f.tell():
                    return (f"its member {info.filename} claims {claimed} bytes of {dtype} {shape}, it holds "
                            f"{info.file_size - f.tell()}")
    return None


def read_weights(path: str | Path) -> tuple[dict[str, np.ndarray], BertConfig | None]:
    """``(arrays, config)`` of a portable weights file."""
    p = Path(path)
    if not p.is_file():
        raise WeightsError(f"weights file {p} does not exist")
    try:
        damage = _npz_damage(p)  # (before anything is allocated: sizes a header claims drive it)
        if damage:
            raise WeightsError(f"{p} is damaged: {damage}; write it again with `hvd-bert convert CHECKPOINT "
                               f"--output {p.name}`")
        with np.load(p, allow_pickle=False) as z:  # never unpickle a file a user hands us
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        if isinstance(e, WeightsError):
            raise
        raise WeightsError(f"{p} is not a readable .npz weights file ({e}); write one with "
                           f"`hvd-bert convert CHECKPOINT --output {p.name}`") from None
    raw = arrays.pop(CONFIG_KEY, None)
    config = config_from_json(raw.tobytes(), str(p)) if raw is not None else None
    arrays = {k: check_values(k, a, str(p)) for k, a in arrays.items()}
    return arrays, config


def fit_weights(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]], *,
                source: str = "weights", allow_missing: tuple[str, ...] = (),
                ignore_unexpected: tuple[str, ...] = ()) -> Mapping[str, np.ndarray]:
    """Check ``arrays`` against the model's ``{name: shape}``; grow the position embeddings if
    the model has more positions. Names starting with ``allow_missing`` prefixes may be absent
    (they keep the model's initialisation), names with ``ignore_unexpected`` prefixes are
    dropped. Anything else that does not fit is a :class:`WeightsError` naming it, raised here
    from the names and shapes alone (a lazy mapping is not read). Returns the fitted weights as
    a mapping that reads each when it is used, its values checked then (:class:`Fitted`)."""
    missing = [k for k in expected if k not in arrays and not k.startswith(allow_missing)]
    unexpected = [k for k in arrays if k not in expected and not k.startswith(ignore_unexpected)]
    wrong, grow = [], set()
    for name, shape in expected.items():
        if name not in arrays:
            continue
        have = shape_of(arrays, name)
        if have != tuple(shape):
            grows = len(have) == 2 == len(shape) and have[1] == shape[1] and have[0] <= shape[0]
            if name == POSITION_EMBEDDINGS and grows:
                grow.add(name)
            else:
                wrong.append(f"{name}: file {have}, model {tuple(shape)}")
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {missing[:6]}{' ...' if len(missing) > 6 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}")
        if wrong:
            parts.append(f"wrong shapes {wrong[:6]}")
        raise WeightsError(f"{source} do not fit this model: {'; '.join(parts)}. Use the same model "
                           f"preset and vocabulary as the run that wrote them")
    return Fitted(arrays, {k: tuple(s) for k, s in expected.items() if k in arrays}, grow, source)


class Fitted(Mapping):
    """What :func:`fit_weights` found to fit, each tensor read when it is used (or a share of it,
    ``weights.lazy.read_share``) and its values checked then (:func:`check_values`: a diverged
    run's checkpoint is refused): a model loads one tensor at a time, never the whole file."""

    def __init__(self, arrays: Mapping, shapes: dict[str, tuple], grow: set, source: str):
        self.arrays, self.shapes, self.grow, self.source = arrays, shapes, grow, source

    def __getitem__(self, name: str) -> np.ndarray:
        a = check_values(name, self.arrays[name], self.source)
        if name in self.grow:  # phase 1's rows, then BERT's init for the rows it never trained
            grown = np.zeros(self.shapes[name], a.dtype)
            grown[: a.shape[0]] = a
            rng = np.random.default_rng(0)
            grown[a.shape[0]:] = rng.normal(0.0, 0.02, (self.shapes[name][0] - a.shape[0], a.shape[1]))
            a = grown
        return a

    def shape_of(self, name: str) -> tuple:
        return self.shapes[name]

    def read_share(self, name: str, dim: int, parts: int, index: int) -> np.ndarray:
        if name in self.grow:
            return read_share({name: self[name]}, name, dim, parts, index)
        return check_values(name, read_share(self.arrays, name, dim, parts, index), self.source)

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


HEADS = ("mlm_", "nsp.")  # the pretraining heads' portable names
TASK_HEADS = ("classifier.", "qa_outputs.")  # the fine-tuning heads' (SQuAD's has no pooler)


def fit_for_model(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]], *,
                  classifier: bool, source: str) -> Mapping[str, np.ndarray]:
    """:func:`fit_weights` with the rules of both frameworks' models: a fine-tuning model
    (``classifier``: a classifier or a SQuAD span model) takes the encoder of any checkpoint
    (its head keeps its initialisation unless the checkpoint has one of the same shape; the
    pretraining heads, another task's head and an unused pooler are dropped); a pretraining model takes a
    checkpoint without heads (a Hugging Face ``BertModel``, say) with fresh heads and one
    warning."""
    if classifier:  # any fine-tuning head: a classifier, a regression head, a SQuAD span head
        return fit_weights(arrays, expected, source=source, allow_missing=(*TASK_HEADS, "pooler."),
                           ignore_unexpected=(*HEADS, *TASK_HEADS, "pooler."))
    has_heads = any(k.startswith(HEADS) for k in arrays)
    if not has_heads:
        import sys
        print(f"warning: {source} has no pretraining heads (masked-LM, next-sentence): they start from "
              f"BERT's initialisation", file=sys.stderr, flush=True)
    return fit_weights(arrays, expected, source=source,
                       allow_missing=() if has_heads else (*HEADS, "pooler."))


def untrained_head(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]]) -> str | None:
    """Which of a fine-tuning model's head weights (``expected``: its portable names and shapes)
    the checkpoint's ``arrays`` lack or hold in another shape, as ``name (missing)`` or ``name
    (shape A, the model's B)``; None when the checkpoint holds the whole head."""
    bad = []
    for name, shape in expected.items():
        if not name.startswith(TASK_HEADS):
            continue
        if name not in arrays:
            bad.append(f"{name} missing")
        elif tuple(arrays[name].shape) != tuple(shape):
            bad.append(f"{name} of shape {tuple(arrays[name].shape)}, the model's {tuple(shape)}")
    return ", ".join(bad) or None


VOCAB_ROWS = ("embeddings.word_embeddings.weight", "mlm_bias")  # one row per vocabulary entry


def pad_vocab_rows(arrays: dict, config: BertConfig, source: str, config_file: str) -> dict:
    """A published checkpoint keeps its vocabulary's size; hvd_bert's models pad it to a
    multiple of 8 (zero rows, never looked up). A row count other than the config's is an error."""
    for name in VOCAB_ROWS:
        if name in arrays:
            a = arrays[name]
            if a.shape[0] != config.vocab_size:
                raise WeightsError(f"{source}: {name} has {a.shape[0]} rows, {config_file}'s vocab_size is "
                                   f"{config.vocab_size}")
            pad = config.padded_vocab_size - a.shape[0]
            if pad:
                arrays[name] = np.concatenate([a, np.zeros((pad, *a.shape[1:]), a.dtype)])
    return arrays
