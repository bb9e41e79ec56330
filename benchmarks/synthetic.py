"""What several benchmarks share: a synthetic pretraining batch, a process's peak memory and
the one JSON result they print (and write with ``--json``)."""

from __future__ import annotations

import json
from pathlib import Path


def pretraining_batch(vocab: int, batch: int, seq: int, predictions: int, seed: int = 0) -> dict:
    """A batch of full rows in the pretraining loss's layout (torch tensors on the CPU)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    positions = np.sort(rng.integers(1, seq, (batch, predictions)), axis=1)
    return {"input_ids": torch.from_numpy(rng.integers(5, vocab, (batch, seq))),
            "segment_ids": torch.zeros(batch, seq, dtype=torch.int64),
            "input_mask": torch.ones(batch, seq, dtype=torch.int64),
            "masked_lm_positions": torch.from_numpy(positions),
            "masked_lm_ids": torch.from_numpy(rng.integers(5, vocab, (batch, predictions))),
            "masked_lm_weights": torch.ones(batch, predictions),
            "next_sentence_labels": torch.zeros(batch, 1, dtype=torch.int64)}


def peak_bytes(device: str = "cpu") -> int:
    """The process's peak: CUDA's allocations on a GPU, the resident high-water mark (``VmHWM``)
    on a CPU."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.max_memory_allocated()
    return next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))


def emit(result: dict, path: str | None) -> None:
    """Print the result as JSON, and write it to ``path`` when given."""
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
