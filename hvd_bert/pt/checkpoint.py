"""Reading hvd_bert's PyTorch checkpoints safely: ``torch.load(..., weights_only=True)`` only,
never a pickle that could run code."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from hvd_bert.train.engine import CheckpointError

__all__ = ["load_checkpoint_file"]


def load_checkpoint_file(path: str | Path, map_location="cpu") -> dict:
    """A ``ckpt-*.pt`` loaded with ``weights_only=True``: tensors and plain types only, so a
    file whose unpickling would run code is refused (:class:`CheckpointError`) and runs nothing."""
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001
        text = str(e)
        if isinstance(e, pickle.UnpicklingError) and ("GLOBAL" in text or "Unsupported global" in text):
            raise CheckpointError(
                f"{path} holds objects other than tensors and plain values, which hvd_bert never writes; "
                f"it was not loaded (loading it could run code inside it). Use a checkpoint written by "
                f"hvd_bert, or delete it") from None
        raise CheckpointError(f"cannot read checkpoint {path}: it is truncated, corrupt or not a PyTorch "
                              f"file ({type(e).__name__}); delete it (a run resumes from the one "
                              f"before)") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "meta" not in ckpt:
        raise CheckpointError(f"{path} is not a checkpoint of hvd_bert's (no model and meta entries); "
                              f"give a ckpt-*.pt written by hvd-bert")
    return ckpt


def load_state_dict_file(path: str | Path) -> dict:
    """A PyTorch ``state_dict`` file (a Hugging Face ``pytorch_model.bin``, an NVIDIA checkpoint's
    ``{"model": ...}``) as float32 numpy arrays, loaded with ``weights_only=True``."""
    from hvd_bert.weights.portable import WeightsError

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise WeightsError(f"{path} cannot be read as a PyTorch state_dict with weights_only=True "
                           f"({type(e).__name__}): truncated, corrupt, or holding more than "
                           f"tensors") from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path} is not a state_dict of tensors")
    return {k: v.detach().float().numpy() for k, v in state.items()}
