"""What the fused kernels of both frameworks agree on (``hvd_bert.pt.kernels.gelu``,
``hvd_bert.tf.kernels``): the GELU forms and the switch that turns compilation off."""

from __future__ import annotations

import os

__all__ = ["GELU_FORMS", "check_gelu_form", "compile_enabled", "env_flag", "env_count"]

GELU_FORMS = ("tanh", "none")  # BERT's tanh approximation; the exact erf form (PyTorch's names)


def check_gelu_form(approximate: str) -> str:
    if approximate not in GELU_FORMS:
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return approximate


def env_flag(name: str) -> bool:
    """A kernel switch: False when the environment variable ``name`` is ``0``, ``false``, ``no``,
    ``off`` or empty; on when unset."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off", "")


def env_count(name: str, default: int, low: int, high: int, meaning: str, env=None) -> int:
    """A count from the environment variable ``name`` (``default`` when unset or empty): a
    whole number from ``low`` to ``high``, else a ConfigError naming the variable, its meaning
    and the range (one line, before anything runs)."""
    text = (os.environ if env is None else env).get(name, "").strip()
    if not text:
        return default
    if text.isdigit() and low <= int(text) <= high:  # (isdigit: no sign, no exponent, no spaces)
        return int(text)
    from hvd_bert.config import ConfigError

    raise ConfigError(f"{name}={text[:40]!r} is not {meaning}: give a whole number from {low} to {high}, or "
                      f"unset it")


def compile_enabled() -> bool:
    """False when ``HVD_BERT_COMPILE`` is ``0``, ``false`` or empty: the eager composition is
    used (same numbers, no compile time)."""
    return env_flag("HVD_BERT_COMPILE")
