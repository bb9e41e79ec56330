"""What defines a run, so that a rerun into a run folder continues that run or is refused.

A run folder's ``config.json`` records the resolved config. A job resuming from the folder's
checkpoints must have the same settings except those that only say how to watch or where to
write (logging, checkpoint cadence, evaluation cadence, progress) and the horizon
(``train.schedule.total_steps``, ``epochs``: extending a run is a resume); any other
difference (model, data, optimizer, schedule shape, batch, precision, seed, framework) is
refused with the differences listed."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["run_differences", "FREE", "previous_config", "has_checkpoints", "resume_mismatch",
           "DamagedConfig"]

# Settings a resumed run may change (dotted prefixes).
FREE = ("train.log_every", "train.checkpoint_every", "train.keep_checkpoints", "train.output_dir",
        "train.resume_resized", "train.resume_unchecked", "train.max_skipped_steps", "train.horovod",
        "train.elastic", "train.schedule.total_steps",
        "progress", "epochs", "eval_every", "eval_batch_size", "eval_batch_users", "target_hr", "eval_data",
        "best_metric", "keep_best", "early_stopping_patience")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def run_differences(old: dict, new: dict, also_free: tuple[str, ...] = ()) -> list[str]:
    """``key: old -> new`` for every defining setting that differs (``also_free``: more keys
    that may change, e.g. the batch layout, which the checkpoint's own checks cover)."""
    a, b = _flat(old), _flat(new)
    diffs = []
    for key in sorted(set(a) | set(b)):
        if any(key == f or key.startswith(f + ".") for f in (*FREE, *also_free)):
            continue
        if a.get(key) != b.get(key):
            diffs.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return diffs


class DamagedConfig(ValueError):
    """A run folder's ``config.json`` that cannot be read as a config."""


def previous_config(folder: Path) -> dict | None:
    """The run folder's recorded config; None if there is none; ``DamagedConfig`` if it is not
    a readable JSON object."""
    p = Path(folder) / "config.json"
    if not p.exists() and not p.is_symlink():
        return None
    try:
        got = json.loads(p.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DamagedConfig(f"{type(e).__name__}: {e}") from None
    if not isinstance(got, dict):
        raise DamagedConfig(f"a JSON {type(got).__name__}, not an object")
    return got


def has_checkpoints(folder: Path) -> bool:
    from hvd_bert.train.checkpoint import list_checkpoints

    return bool(list_checkpoints(folder, "pt") or list_checkpoints(folder, "tf"))


def resume_mismatch(out: Path, new: dict, also_free: tuple[str, ...] = ()) -> str | None:
    """Why a run with the resolved config ``new`` may not go on in ``out``: the folder holds
    checkpoints of a run whose ``config.json`` differs in a defining setting. None if it may."""
    if not has_checkpoints(out):
        return None
    try:
        old = previous_config(out)
        why = None if old is not None else "is missing"
    except DamagedConfig as e:
        old, why = None, f"is damaged ({e})"
    if old is None:
        if _flat(new).get("train.resume_unchecked"):
            return None
        return (f"{out} holds checkpoints, but its config.json {why}: this run's settings cannot be "
                f"checked against them. Restore {out / 'config.json'}, or, to resume them with the "
                f"settings given now, rerun with --set train.resume_unchecked=true")
    diffs = run_differences(old, new, also_free)
    if not diffs:
        return None
    return (f"{out} holds checkpoints of a run with other settings, which this run would resume: "
            f"{'; '.join(diffs)}. Give this run another train.output_dir, or rerun with the settings "
            f"of {out / 'config.json'} (only the horizon, train.schedule.total_steps or epochs, and the "
            f"logging, checkpoint and evaluation cadence may change on a resume)")

