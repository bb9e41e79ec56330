"""Fused kernels: bias + GELU through ``torch.compile``, with an eager fallback.

BERT's intermediate layer computes ``gelu(x W^T + b)``. Unfused, that reads and writes the
activation several times (the add, then each elementwise op of GELU); compiled, the add and
the GELU (forward and backward) become one loop over memory. Both GELU forms are supported:
``"tanh"`` (BERT's original approximation) and ``"none"`` (the exact erf form).

Set ``HVD_BERT_COMPILE=0`` to use the eager composition (same numbers, no compile time). If
compiling fails (no C++ compiler, an unsupported platform), the eager path is used with one
warning.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from hvd_bert.common.kernels import check_gelu_form, compile_enabled

__all__ = ["bias_gelu", "bias_gelu_eager", "compile_enabled", "LinearGELU"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def bias_gelu_eager(x: torch.Tensor, bias: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """The unfused composition: ``gelu(x + bias)``."""
    y = x + bias
    if approximate == "tanh":
        return 0.5 * y * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y * y * y)))
    check_gelu_form(approximate)
    return 0.5 * y * (1.0 + torch.erf(y * (1.0 / math.sqrt(2.0))))


_compiled: dict[str, Callable] = {}
_failed = False


def _compiled_fn(approximate: str) -> Callable | None:
    global _failed
    if _failed or not compile_enabled():
        return None
    fn = _compiled.get(approximate)
    if fn is None:
        def f(x, b):
            return bias_gelu_eager(x, b, approximate)
        fn = _compiled[approximate] = torch.compile(f, dynamic=None, fullgraph=True)
    return fn


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """``gelu(x + bias)`` as one fused kernel (forward and backward)."""
    global _failed
    check_gelu_form(approximate)
    fn = _compiled_fn(approximate)
    if fn is not None:
        try:
            return fn(x, bias)
        except Exception as e:  # noqa: BLE001  (compiler missing or unsupported: fall back)
            _failed = True
            warnings.warn(f"hvd_bert: torch.compile of bias+GELU failed ({type(e).__name__}: "
                          f"{str(e)[:200]}); using the eager composition", stacklevel=2)
    return bias_gelu_eager(x, bias, approximate)


class LinearGELU(torch.nn.Module):
    """``gelu(x W^T + b)`` with the bias add fused into the GELU (BERT's intermediate layer).
    Its parameters are named like ``torch.nn.Linear``'s (``weight``, ``bias``)."""

    def __init__(self, in_features: int, out_features: int, approximate: str = "tanh"):
        super().__init__()
        lin = torch.nn.Linear(in_features, out_features)
        self.weight = lin.weight
        self.bias = lin.bias
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return bias_gelu(F.linear(x, self.weight), self.bias, self.approximate)
