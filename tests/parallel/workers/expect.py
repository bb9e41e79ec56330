"""Data and hand-computed results for the basic Horovod workers (numpy only).

A linear model y = X w (no bias) with mean-squared error, plain SGD. Each rank has its own
data; with backward_passes_per_step = K, a rank's K micro-batches of LOCAL_B rows are
averaged, then the ranks' gradients are averaged: one step on the global batch.
"""

import os

import numpy as np

K = 2            # backward_passes_per_step
LOCAL_B = 2      # rows per micro-batch
LR = 0.1
W0 = np.array([[0.5], [-0.25], [1.0]], dtype=np.float32)


def rank_data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank + int(os.environ.get("HVD_BERT_TEST_SEED_SHIFT", "0")))
    x = rng.normal(size=(K * LOCAL_B, 3)).astype(np.float32)
    y = rng.normal(size=(K * LOCAL_B, 1)).astype(np.float32)
    return x, y


def mse_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d/dw mean((x w - y)^2)."""
    w, x, y = (a.astype(np.float64) for a in (w, x, y))
    return 2.0 / len(x) * x.T @ (x @ w - y)


def global_gradient(size: int) -> np.ndarray:
    """The gradient of one batch made of every rank's data (what the step must use)."""
    xs, ys = zip(*(rank_data(r) for r in range(size)))
    return mse_grad(W0, np.concatenate(xs), np.concatenate(ys))


def expected_weights(size: int) -> np.ndarray:
    return W0.astype(np.float64) - LR * global_gradient(size)


def expected_allreduce_sum(size: int) -> list[float]:
    """Each rank contributes [r + 1, 2 (r + 1)]."""
    s = size * (size + 1) / 2
    return [s, 2 * s]


BROADCAST_ROOT_VALUE = 7.0  # rank r holds 10 r + 7; after the broadcast from 0 all hold 7
