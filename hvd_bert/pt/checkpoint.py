"""Reading hvd_bert's PyTorch checkpoints safely: ``torch.load(..., weights_only=True)`` only,
never a pickle that could run code."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from hvd_bert.files import atomic_write
from hvd_bert.train.checkpoint import checkpoint_path, prune
from hvd_bert.train.engine import CheckpointError, host_rng_state, set_host_rng_state

__all__ = ["CKPT_SUFFIX", "load_checkpoint_file", "state_digest", "write_checkpoint", "to_cpu", "rng_state",
           "set_rng_state", "nonfinite", "optimizer_state_fault", "check_optimizer_state"]

CKPT_SUFFIX = "pt"

_FIX = "delete it to resume from the one before, or restore it from a copy"


def state_digest(state) -> str:
    """A CRC-32C over every tensor and plain value of a checkpoint's state (its entries in name
    order), recorded in the checkpoint's metadata and checked when it is loaded."""
    import crc32c

    value = 0

    def walk(x):
        nonlocal value
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.view(torch.int16)
            elif t.dtype == torch.bool:
                t = t.to(torch.uint8)
            value = crc32c.crc32c(t.reshape(-1).numpy().tobytes(), value)
        elif isinstance(x, dict):
            for k in sorted(x, key=str):
                value = crc32c.crc32c(str(k).encode(), value)
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        else:
            value = crc32c.crc32c(repr(x).encode(), value)
    walk(state)
    return f"crc32c:{value:08x}"


def load_checkpoint_file(path: str | Path, map_location="cpu") -> dict:
    """A ``ckpt-*.pt`` loaded with ``weights_only=True``: tensors and plain types only, so a
    file whose unpickling would run code is refused (:class:`CheckpointError`) and runs nothing.
    Its bytes are checked first (every part's zip CRC-32), and its tensors against the digest its
    metadata recorded (``state_digest``)."""
    from hvd_bert.train.checkpoint import zip_damage

    damage = zip_damage(path)
    if damage is not None:
        raise CheckpointError(f"{damage}; {_FIX}")
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
    try:
        recorded = json.loads(ckpt["meta"]).get("digest")
    except (TypeError, ValueError, AttributeError, RecursionError):
        recorded = None  # (the metadata's own reader names its damage)
    if recorded and recorded != state_digest({k: v for k, v in ckpt.items() if k != "meta"}):
        raise CheckpointError(f"{path} is damaged: its tensors no longer match the digest recorded when it "
                              f"was written; {_FIX}")
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


def write_checkpoint(folder: str | Path, step: int, state: dict, meta: dict, keep: int) -> Path:
    """``folder/ckpt-<step>.pt`` written atomically (tensors and plain types only: it loads with
    ``weights_only=True``; the metadata as JSON in it), keeping the newest ``keep``."""
    state = {**state, "meta": json.dumps(meta)}
    path = checkpoint_path(folder, step, CKPT_SUFFIX)
    atomic_write(path, lambda tmp: torch.save(state, tmp), size=_nbytes(state))
    prune(folder, CKPT_SUFFIX, keep)
    return path


def to_cpu(obj):
    """A copy of a state dict with its tensors copied to the CPU (nested dicts and lists
    rebuilt; other leaves are immutable)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_cpu(v) for v in obj]
    return obj


def _nbytes(obj) -> int:
    """The bytes of the tensors in a (nested) state dict: about what its file takes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def rng_state() -> dict:
    """This process's RNG states as plain JSON values (the torch state's bytes as a list)."""
    state = {"torch": torch.get_rng_state().tolist(), **host_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    set_host_rng_state(state)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def nonfinite(named: dict, loss_scale: float = 1.0) -> list[str]:
    """The names of the floating-point tensors of ``named`` holding NaN or infinite values, and
    the loss scale when it is not a positive number."""
    import math

    bad = [n for n, t in named.items() if torch.is_tensor(t) and t.is_floating_point()
           and not bool(torch.isfinite(t).all())]
    return bad + ([] if math.isfinite(loss_scale) and loss_scale > 0 else [f"the loss scale {loss_scale}"])


def optimizer_state_fault(state_dict: dict, shapes: list | None, step: int) -> str | None:
    """What is wrong with an optimizer ``state_dict`` read from a checkpoint, or None: every
    parameter of its groups with state of its own (once any has), each buffer of the parameter's
    shape (``shapes``, in the optimizer's order; None: not checked), and each step counter a
    whole number from 0 to the checkpoint's ``step`` (a negative or larger count would drive the
    bias corrections)."""
    import math

    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list):
        return "it is not an optimizer's state (no parameter groups)"
    index = [i for g in state_dict["param_groups"] for i in g.get("params", [])]
    state = state_dict.get("state") or {}
    if shapes is not None and len(index) != len(shapes):
        return f"its groups hold {len(index)} parameters, the model's optimizer {len(shapes)}"
    missing = [i for i in index if i not in state]
    if state and missing:
        return f"parameter {missing[0]} has no state ({len(missing)} of {len(index)})"
    for n, i in enumerate(index):
        for name, v in (state.get(i) or {}).items():
            if not torch.is_tensor(v):
                continue
            if v.dim() == 0:
                t = float(v)
                if name == "step" and not (math.isfinite(t) and t == int(t) and 0 <= t <= step):
                    return f"parameter {i}'s step count is {t}, not a count from 0 to its step {step}"
            elif shapes is not None and tuple(v.shape) != tuple(shapes[n]):
                return f"parameter {i}'s {name} has the shape {tuple(v.shape)}, its own {tuple(shapes[n])}"
    return None


def check_optimizer_state(ckpt: dict, path, shapes: list | None) -> None:
    """A consolidated checkpoint's optimizer state checked before it is used or broadcast
    (:func:`optimizer_state_fault`): a CheckpointError naming the file otherwise."""
    import json

    from hvd_bert.train.engine import CheckpointError

    fault = optimizer_state_fault(ckpt["optimizer"], shapes, json.loads(ckpt["meta"])["step"])
    if fault:
        raise CheckpointError(f"checkpoint {path} holds an optimizer state that does not fit: {fault}; "
                              f"delete it to resume from the one before, or start afresh in another "
                              f"train.output_dir")
