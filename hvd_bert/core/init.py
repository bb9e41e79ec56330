"""Layout-independent initialisation (REFERENCE section 10): each tensor is drawn whole from a
generator seeded by (seed, its name), and each rank keeps its share of it, so the same seed gives
the same dense model whatever the layout (tensor-parallel degree, world size), and no rank ever
holds more than one whole tensor beside its own share.

    rule, std = bert_rule("layers.0.query.weight", 0.02)   # ("normal", 0.02)
    g = generator(tensor_seed(seed, name))                  # (a framework's own generator)
"""

from __future__ import annotations

import hashlib

__all__ = ["tensor_seed", "bert_rule"]


def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit seed for the tensor ``name`` of a model seeded ``seed`` (BLAKE2b of both: names
    that differ in one character draw unrelated numbers)."""
    digest = hashlib.blake2b(f"{int(seed)}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def bert_rule(name: str, std: float) -> tuple[str, float]:
    """BERT's initialisation of the parameter ``name`` (Devlin et al.; ``modeling.py``): LayerNorm
    scales ones, every bias zeros, every other weight (linear layers, embeddings) N(0, std)."""
    last = name.rsplit(".", 1)[-1]
    if "LayerNorm" in name:
        return ("ones", 0.0) if last in ("weight", "gamma") else ("zeros", 0.0)
    if last == "bias" or name.endswith("_bias"):
        return "zeros", 0.0
    return "normal", std
