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

__all__ = ["data_identity", "run_record", "run_differences", "FREE", "previous_config", "has_checkpoints",
           "resume_mismatch", "DamagedConfig", "rank_identity", "ranks_disagree"]

# Paths that may differ between ranks (a node's own copy of the data): their contents are compared
PER_NODE_PATHS = ("data", "eval_data", "init_checkpoint", "checkpoint", "input")

# Settings a resumed run may change (dotted prefixes).
FREE = ("train.log_every", "train.checkpoint_every", "train.keep_checkpoints", "train.output_dir",
        "train.resume_resized", "train.resume_unchecked", "train.max_skipped_steps", "train.stall_timeout_s",
        "train.checkpoint_format", "train.precision.weights",
        "train.report_to",
        "train.horovod", "train.elastic", "train.zero", "train.tensor_parallel", "train.schedule.total_steps",
        "progress", "epochs", "eval_every", "eval_batch_size", "eval_batch_users", "target_hr", "eval_data",
        "best_metric", "keep_best", "early_stopping_patience", "data_identity")

# The prepared folders a run trains and evaluates on, identified by content (a data set prepared
# again at the same path is another data set)
DATA_KEYS = ("data", "eval_data")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def run_differences(old: dict, new: dict, also_free: tuple[str, ...] = (),
                    defaults: dict | None = None) -> list[str]:
    """``key: old -> new`` for every defining setting that differs (``also_free``: more keys
    that may change, e.g. the batch layout, which the checkpoint's own checks cover;
    ``defaults``: the job's default config, whose values stand in for the settings an older
    version did not record: a setting added later keeps the older behaviour by default)."""
    a, b = {**_flat(defaults or {}), **_flat(old)}, _flat(new)
    diffs = []
    was = old.get("data_identity") if isinstance(old.get("data_identity"), dict) else {}
    for key in sorted(set(a) | set(b)):
        if any(key == f or key.startswith(f + ".") for f in (*FREE, *also_free)):
            continue
        if key in PER_NODE_PATHS and isinstance(a.get(key), str) and isinstance(b.get(key), str) and (
                _same_path(a[key], b[key])
                or (key in DATA_KEYS and was.get(key) and was.get(key) == data_identity(new).get(key))):
            continue  # (the same folder spelt another way: "cd/", "./cd", its absolute path, a copy)
        if a.get(key) != b.get(key):
            diffs.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return diffs


def _same_path(x: str, y: str) -> bool:
    """Whether two spellings name one path: equal once normalised (``cd/``, ``./cd``), or the same
    file or folder from here (a relative and an absolute spelling, a link to it)."""
    import os

    if os.path.normpath(x) == os.path.normpath(y):
        return True
    try:
        return os.path.exists(x) and os.path.samefile(os.path.expanduser(x), os.path.expanduser(y))
    except OSError:
        return False


def data_identity(cfg: dict) -> dict:
    """``{key: its dataset.json's SHA-256}`` of the run's prepared data folders
    (``data.sidecar.sidecar_digest``)."""
    from hvd_bert.data.sidecar import sidecar_digest

    out = {}
    for key in DATA_KEYS:
        path = cfg.get(key)
        if isinstance(path, str) and path and (digest := sidecar_digest(path)) is not None:
            out[key] = digest
    return out


def run_record(cfg: dict) -> dict:
    """What a run folder's ``config.json`` holds: the resolved config and ``data_identity``."""
    return {**cfg, "data_identity": data_identity(cfg)}


def _data_changed(old: dict, new: dict) -> str | None:
    was, now = old.get("data_identity"), data_identity(new)
    if not isinstance(was, dict):
        return None  # (a run folder from before the data was identified by content)
    for key in DATA_KEYS:
        if key == "data" and was.get(key) and now.get(key) and was[key] != now[key]:
            return (f"{key} {new.get(key)} holds other data than this run's checkpoints were trained on (its "
                    f"dataset.json differs from the one recorded in config.json: it was prepared again): "
                    f"resuming would go on with other data. Restore the original data, or start a new run "
                    f"in another train.output_dir")
    return None


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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise DamagedConfig(f"{type(e).__name__}: {e}") from None
    if not isinstance(got, dict):
        raise DamagedConfig(f"a JSON {type(got).__name__}, not an object")
    return got


def has_checkpoints(folder: Path) -> bool:
    from hvd_bert.train.checkpoint import ALL, list_checkpoints

    return bool(list_checkpoints(folder, ALL))


def resume_mismatch(out: Path, new: dict, also_free: tuple[str, ...] = (),
                    defaults: dict | None = None) -> str | None:
    """Why a run with the resolved config ``new`` may not go on in ``out``: the folder holds
    checkpoints of a run whose ``config.json`` differs in a defining setting (``defaults``: as
    :func:`run_differences`). None if it may."""
    if not has_checkpoints(out):
        return None
    foreign = _foreign_checkpoints(out, _flat(new).get("framework"))
    if foreign:
        return foreign
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
    diffs = run_differences(old, new, also_free, defaults)
    if not diffs:
        return _data_changed(old, new)
    return (f"{out} holds checkpoints of a run with other settings, which this run would resume: "
            f"{'; '.join(diffs)}. Give this run another train.output_dir, or rerun with the settings "
            f"of {out / 'config.json'} (only the horizon, train.schedule.total_steps or epochs, and the "
            f"logging, checkpoint and evaluation cadence may change on a resume)")



def _foreign_checkpoints(out: Path, framework) -> str | None:
    """Why a run of ``framework`` cannot go on in ``out``: its checkpoints are all the other
    framework's own files (``ckpt-*.pt`` / ``ckpt-*.tf``; sharded ones are either's). Whatever
    config.json says, or when it is missing: resuming nothing, the run would start over and write
    over the folder's metrics."""
    from hvd_bert.train.checkpoint import SHARDED, list_checkpoints

    names = {"pt": "PyTorch", "tf": "TensorFlow"}
    if framework not in names:
        return None
    other = "tf" if framework == "pt" else "pt"
    theirs = list_checkpoints(out, other)
    if not theirs or list_checkpoints(out, (framework, SHARDED)):
        return None
    return (f"{out} holds {names[other]} checkpoints ({theirs[-1][1].name}), which a {names[framework]} run "
            f"cannot resume: resume them with --framework {other}, or give this run another "
            f"train.output_dir")


def rank_identity(cfg: dict) -> dict:
    """What every rank of a job must share: its resolved settings, with each data folder's path
    replaced by what it holds (its sidecar's SHA-256: a node may keep its own copy elsewhere)."""
    import hashlib

    flat = _flat(cfg)
    for key in PER_NODE_PATHS:
        path = flat.get(key)
        if isinstance(path, str) and path:
            side = Path(path).expanduser() / "dataset.json"
            try:
                flat[key] = "dataset " + hashlib.sha256(side.read_bytes()).hexdigest()[:16]
            except OSError:
                flat[key] = "given"  # a file, or not there (the job's own checks name it)
    return flat


def ranks_disagree(identities: list[dict]) -> str | None:
    """The settings on which the ranks' ``rank_identity`` differ, each with its values and
    ranks, as one line; None when they all agree."""
    keys = sorted({k for ident in identities for k in ident})
    parts = []
    for key in keys:
        by_value: dict[str, list[int]] = {}
        for rank, ident in enumerate(identities):
            by_value.setdefault(repr(ident.get(key)), []).append(rank)
        if len(by_value) > 1:
            parts.append(f"{key} is " + " but ".join(
                f"{v} on rank{'s' if len(r) > 1 else ''} {_ranks(r)}" for v, r in by_value.items()))
    if not parts:
        return None
    shown = "; ".join(parts[:4]) + (f"; and {len(parts) - 4} more" if len(parts) > 4 else "")
    return (f"the ranks were given different settings: {shown}. Give every rank the same recipe, "
            f"--set options and data")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 6 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"
