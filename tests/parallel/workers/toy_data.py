"""The regression data and batch layout shared by the PyTorch and TensorFlow workers (numpy)."""

import os

import numpy as np

# tests/bounds/measure.py runs the tests on other data and weights (tests/closeness.py)
SHIFT = int(os.environ.get("HVD_BERT_TEST_SEED_SHIFT", "0"))

N_ROWS, IN, HID, OUT = 512, 8, 16, 4


def dataset(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + SHIFT)
    x = rng.normal(size=(N_ROWS, IN)).astype(np.float32)
    w = rng.normal(size=(IN, OUT)).astype(np.float32)
    y = np.tanh(x @ w) + 0.1 * rng.normal(size=(N_ROWS, OUT)).astype(np.float32)
    return x, y.astype(np.float32)


def global_rows(step: int, global_batch: int) -> np.ndarray:
    """Row indices of optimizer step ``step`` (0-based): consecutive, wrapping around."""
    return np.arange(step * global_batch, (step + 1) * global_batch) % N_ROWS


def rank_rows(rank: int, world: int, local_b: int, k: int, micro: int) -> np.ndarray:
    """Rows of micro-batch ``micro`` of ``rank``: its contiguous share of the global batch,
    cut into k micro-batches of ``local_b`` rows."""
    step, i = divmod(micro, k)
    return global_rows(step, world * local_b * k)[rank * local_b * k + i * local_b:][:local_b]


LR = {"sgd": 0.05, "lamb": 0.02, "nvlamb": 0.02, "lars": 2.0, "adamw": 0.01, "lion": 0.003}


def overrides(optim: str, local_b: int, k: int, steps: int, *extra: str) -> list[str]:
    """(Checkpoints: consolidated, whose files these workers' tests read; a multi-rank default is
    sharded, which tests/parallel/test_sharded_checkpoints.py and the job tests cover.)"""
    return [f"optim.name={optim}", f"optim.lr={LR[optim]}", "optim.weight_decay=0.01",
            f"batch.local_batch_size={local_b}", f"batch.backward_passes_per_step={k}",
            "schedule.name=poly_warmup", "schedule.warmup=0.2", f"schedule.total_steps={steps}",
            "checkpoint_format=consolidated", *extra]
