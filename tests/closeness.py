"""Float comparisons whose tolerances are measured, not guessed.

``assert_close(actual, desired, rtol=..., atol=..., site="...")`` is
``np.testing.assert_allclose`` that can also report how close it came: with
``HVD_BERT_BOUNDS_LOG=FILE`` in the environment it appends the worst ratio of
``|actual - desired|`` to the allowed ``atol + rtol * |desired|`` (1.0 is the bound) under
``site``, before asserting. ``seed_of(base)`` is ``base`` in the suite and ``base + shift`` when
``HVD_BERT_TEST_SEED_SHIFT`` is set, so the same tests run on other inputs.

``tests/bounds/measure.py`` runs the tests on several seed shifts and prints each site's worst
ratio: the bound's margin is its inverse. The figures are in tests/bounds/MEASURED.md and next
to each tolerance.
"""

from __future__ import annotations

import json
import os

import numpy as np


def seed_of(base: int) -> int:
    """The test's own seed, shifted when a measurement asks for other inputs."""
    return base + int(os.environ.get("HVD_BERT_TEST_SEED_SHIFT", "0"))


def _array(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().double()
    elif hasattr(x, "numpy"):  # a TensorFlow tensor or variable
        x = x.numpy()
    return np.asarray(x, dtype=np.float64)


def worst_ratio(actual, desired, rtol: float, atol: float) -> float:
    a, d = _array(actual), _array(desired)
    allowed = atol + rtol * np.abs(d)
    diff = np.abs(a - d)
    if not diff.size:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, diff / allowed, np.where(diff > 0, np.inf, 0.0))
    return float(np.nanmax(ratio))


def record(site: str, ratio: float) -> None:
    log = os.environ.get("HVD_BERT_BOUNDS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"site": site, "ratio": ratio}) + "\n")


def assert_close(actual, desired, *, rtol: float = 1e-7, atol: float = 0.0, site: str,
                 err_msg: str = "") -> None:
    """``np.testing.assert_allclose`` (the same defaults), recorded for tests/bounds/measure.py."""
    record(site, worst_ratio(actual, desired, rtol, atol))
    np.testing.assert_allclose(_array(actual), _array(desired), rtol=rtol, atol=atol, err_msg=err_msg)

