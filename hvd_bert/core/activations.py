"""Activation memory of hvd_bert's BERT, from the shape: what autograd keeps for the backward
pass, per encoder layer and for the embeddings and heads, under each precision and
``train.activation_checkpointing`` policy, and a rank's peak from it.

The coefficients count the tensors the PyTorch model saves (``hvd_bert.pt.models.bert``: the
fused QKV projection keeps its input and its concatenated weight, the attention its scaled
queries, keys and values, the softmax output and its dropout, the MLP its pre-activation and
GELU, each LayerNorm its input and statistics). With ``s`` sequence, ``b`` local batch, ``h``
hidden, ``a`` heads, ``i`` intermediate and ``T`` the tensor-parallel degree, in bytes:

    fp32, kept          4 (8 s b h + 2 s b i / T + 2 a s^2 b / T + 4 s b) + 12 h^2 / T
    bf16 autocast, kept 32 s b h + 4 s b i / T + 12 a s^2 b / T + 16 s b + 2 (7 h^2 + 2 h i) / T
    attention recomputed: fp32 4 (5 s b h + 2 s b i / T + 4 s b); bf16 20 s b h + 4 s b i / T + 16 s b
                          + 2 (h^2 + 2 h i) / T
    layer recomputed    4 s b h (its input only)

(bf16 keeps the layers' bf16 weight copies autocast makes.) Measured with
``torch.autograd.graph.saved_tensors_hooks`` they hold to the byte for T = 1
(tests/pt/test_activation_plan.py). The embeddings and heads keep about ``8 s b h + 26 s b``
and, per masked position, its vocabulary's log-probabilities (``4 V + 16 h`` bytes). The peak
of a step adds the backward pass's working set: one layer's kept activations (a recomputed
layer is rebuilt whole while its gradient is taken) and the gradient of the sequence output.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ActivationShape", "layer_bytes", "kept_bytes", "step_peak_bytes"]


@dataclass(frozen=True)
class ActivationShape:
    """One rank's micro-batch through BERT: ``micro_batch`` sequences of ``seq`` tokens."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    seq: int
    micro_batch: int
    predictions: int = 0  # masked positions per sequence (the MLM head's logits)
    vocab: int = 0


def layer_bytes(x: ActivationShape, precision: str = "fp32", recompute: str = "none", tp: int = 1,
                flash: bool = False) -> float:
    """What one encoder layer keeps: ``recompute`` ``none``, ``attention`` or ``layer``. ``flash``:
    the attention is a fused kernel that keeps its softmax's statistics, not its probabilities (a
    GPU's scaled_dot_product_attention): the ``a s^2 b`` terms become ``a s b`` ones."""
    s, b, h, a, i = x.seq, x.micro_batch, x.hidden, x.heads, x.intermediate
    sbh, sbi, sb = s * b * h, s * b * i / tp, s * b
    as2b = a * s * b / tp / (3 if precision in ("bf16", "fp16") else 2) if flash else a * s * s * b / tp
    bf16 = precision in ("bf16", "fp16")
    if recompute == "layer":
        return 4.0 * sbh
    if recompute == "attention":
        if bf16:
            return 20 * sbh + 4 * sbi + 16 * sb + 2 * (h * h + 2 * h * i) / tp
        return 4.0 * (5 * sbh + 2 * sbi + 4 * sb)
    if bf16:
        return 32 * sbh + 4 * sbi + 12 * as2b + 16 * sb + 2 * (7 * h * h + 2 * h * i) / tp
    return 4.0 * (8 * sbh + 2 * sbi + 2 * as2b + 4 * sb) + 12.0 * h * h / tp


def _heads_bytes(x: ActivationShape, precision: str) -> float:
    s, b, h = x.seq, x.micro_batch, x.hidden
    copies = 2.0 * (x.vocab + h) * h if precision in ("bf16", "fp16") else 0.0  # (autocast's weight copies)
    return 8.0 * s * b * h + 26.0 * s * b + b * x.predictions * (4.0 * x.vocab + 16.0 * h) + copies


def kept_bytes(x: ActivationShape, precision: str = "fp32", every: int = 0, attention: bool = False,
               tp: int = 1, flash: bool = False) -> float:
    """All a forward pass keeps for its backward pass: every ``every``-th layer recomputed whole
    (``train.activation_checkpointing`` as ``config.train.activation_policy`` reads it), the
    others keeping theirs (their attention recomputed with ``attention``)."""
    recomputed = x.layers // every if every else 0
    rest = "attention" if attention else "none"
    kept = (x.layers - recomputed) * layer_bytes(x, precision, rest, tp, flash)
    return recomputed * layer_bytes(x, precision, "layer", tp) + kept + _heads_bytes(x, precision)


def step_peak_bytes(x: ActivationShape, precision: str = "fp32", every: int = 0,
                    attention: bool = False, tp: int = 1, flash: bool = False) -> float:
    """The activations' share of a training step's peak: what the forward pass keeps, plus the
    backward pass's working set (one layer's activations, rebuilt if recomputed, and the
    gradient flowing through the layers)."""
    working = layer_bytes(x, precision, "attention" if attention and not every else "none", tp, flash)
    flowing = 8.0 * x.seq * x.micro_batch * x.hidden
    return kept_bytes(x, precision, every, attention, tp, flash) + working + flowing
