"""BERT's architecture as one config shared by both frameworks, with the published presets."""

from __future__ import annotations

import math

from dataclasses import dataclass, replace
from typing import Literal

__all__ = ["BertConfig", "PRESETS", "bert_preset"]


# (name, least, most): a published config past these is damaged, not a bigger BERT
_BOUNDS = (("vocab_size", 1, 10_000_000), ("hidden_size", 1, 65_536), ("num_layers", 1, 1_000),
           ("num_heads", 1, 4_096), ("intermediate_size", 1, 1_000_000),
           ("max_position_embeddings", 1, 1_000_000), ("type_vocab_size", 1, 10_000))


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    gelu: Literal["tanh", "none"] = "tanh"  # BERT's tanh approximation, or the exact erf form

    def __post_init__(self):
        for name, low, high in _BOUNDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {v!r}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        # (finite: an infinite initializer_range draws infinite weights, which train as skipped steps)
        if not (0 < self.layer_norm_eps < 1 and 0 < self.initializer_range <= 1):
            raise ValueError(f"layer_norm_eps must be in (0, 1) and initializer_range in (0, 1], got "
                             f"{self.layer_norm_eps}, {self.initializer_range}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"gelu must be 'tanh' or 'none', got {self.gelu!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads "
                             f"{self.num_heads}")

    @classmethod
    def from_published(cls, raw: dict, *, gelu: str, layer_norm_eps: float | None = None) -> BertConfig:
        """From a published config (Hugging Face ``config.json`` or Google ``bert_config.json``:
        the same field names); raises KeyError for a missing size, ValueError for a bad one."""
        def number(key: str, kind, default=None):
            value = raw[key] if default is None else raw.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value != kind(value):  # (an infinite count has no integer: 1e400 is JSON's inf)
                what = "an integer" if kind is int else "a finite number"
                raise ValueError(f"{key} is {value!r}, not {what}")
            return kind(value)

        eps = layer_norm_eps if layer_norm_eps is not None else number("layer_norm_eps", float, 1e-12)
        return cls(vocab_size=number("vocab_size", int), hidden_size=number("hidden_size", int),
                   num_layers=number("num_hidden_layers", int), num_heads=number("num_attention_heads", int),
                   intermediate_size=number("intermediate_size", int),
                   max_position_embeddings=number("max_position_embeddings", int, 512),
                   type_vocab_size=number("type_vocab_size", int, 2),
                   hidden_dropout=number("hidden_dropout_prob", float, 0.1),
                   attention_dropout=number("attention_probs_dropout_prob", float, 0.1),
                   initializer_range=number("initializer_range", float, 0.02), layer_norm_eps=eps, gelu=gelu)

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary padded to a multiple of 8 (Tensor Core friendly, as NVIDIA does)."""
        return (self.vocab_size + 7) // 8 * 8

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_heads


# Google BERT's released sizes (tiny .. medium from "Well-Read Students Learn Better", 2019).
PRESETS = {
    "tiny": BertConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512),
    "mini": BertConfig(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "small": BertConfig(hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048),
    "base": BertConfig(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "large": BertConfig(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
}


def bert_preset(name: str, **overrides) -> BertConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown BERT preset {name!r}; choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)
