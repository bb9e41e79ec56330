"""The seam between the jobs and a framework: the engine interface and the one checkpoint
metadata schema. Framework-free (numpy and the standard library); ``hvd_bert.pt.engine.Engine``
and ``hvd_bert.tf.engine.Engine`` implement :class:`Engine`, and every job trains through
``train.loop.fit``.

    engine = backend.engine(model, loss_fn, cfg.train)     # a framework's Engine
    result = fit(engine, batches_from, total_steps=..., output_dir=...)

What an engine promises (tested against both by ``tests/parallel/test_engine_contract.py``):
  * ``train_micro_batch(batch)`` back-propagates one micro-batch of this rank and, on every
    ``k``-th, allreduces, checks for inf/NaN on the reduced gradients (so every rank decides
    the same), unscales, clips and applies one update: it returns a :class:`StepResult` then
    and ``None`` otherwise. ``last_metrics`` holds the micro-batch's ``loss`` and the metrics
    of its loss function (framework scalars: read them once per step). With ``defer=True``
    (the loop's) the step's outcome may stay on the device: ``finish_step(result, sums)``
    reads it and the metric sums to the host in one transfer and counts the step.
  * N ranks x k micro-batches of b equal one process on the global batch N*k*b.
  * ``save`` writes one checkpoint atomically from rank 0 with the metadata of
    :func:`checkpoint_meta` (counters, data position, batch layout, every rank's RNG);
    ``resume`` restores it on every rank, refusing a different world size or global batch
    unless ``train.resume_resized`` allows it (:func:`check_resume`), and a failure to read
    it is raised on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from hvd_bert.core.batch import BatchPlan
from hvd_bert.train.checkpoint import is_checkpoint_name, latest_checkpoint, remove_stale_temporaries
from hvd_bert.train.memory import MemoryPhases

__all__ = ["StepResult", "FitResult", "Engine", "checkpoint_meta", "check_resume", "ResumeError",
           "CheckpointError", "resume_on_rank0", "META_FORMAT", "host_rng_state", "set_host_rng_state",
           "rng_for_rank", "restore_rng", "refuse_nonfinite", "check_engine_args", "engine_settings"]

META_FORMAT = 1  # the version of the metadata schema below


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read (corrupt, truncated, not hvd_bert's, unsafe)."""


class ResumeError(ValueError):
    """A checkpoint written by a run whose batch layout differs from this one."""


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did (identical on every rank)."""

    step: int            # optimizer steps applied so far
    lr: float            # the LR used (or that would have been used, when skipped)
    skipped: bool        # inf/NaN in the reduced gradients: no update, schedule not advanced
    grad_norm: float     # global norm of the reduced, unscaled gradients
    loss_scale: float    # the loss scale after this step (1.0 without fp16)


@dataclass
class FitResult:
    steps: int
    skipped_steps: int
    last_loss: float
    checkpoint: Path | None
    stopped_early: bool  # by a signal or by on_step
    history: list[dict] = field(default_factory=list)
    stopped_by_signal: bool = False
    # which phase set rank 0's peak memory: a job prints it last (after its final evaluation)
    phases: MemoryPhases | None = None


@runtime_checkable
class Engine(Protocol):
    """What :func:`fit` and the jobs need of a framework's engine."""

    rank: int
    world_size: int
    k: int                     # backward_passes_per_step
    plan: BatchPlan | None     # the batch layout (set by ``from_config``)
    step_count: int            # optimizer steps applied (the schedule's t after the step)
    micro_step: int            # micro-batches back-propagated over the whole run
    skipped_steps: int         # steps skipped for inf/NaN
    last_metrics: dict         # the last micro-batch's {"loss": ..., **metrics}
    target_global_batch: int | None  # an elastic run's configured global batch (None otherwise;
    #                                  its plan may be the nearest one), kept in checkpoints
    config: Any                # its TrainConfig (``from_config``), or None for an engine built by hand
    keep_checkpoint_batch: bool  # a resume under a new layout keeps the checkpoint's global batch
    data_rank: int             # this rank's data-parallel replica (the rank without tensor parallelism)
    data_size: int             # the data-parallel replicas (world size / tensor-parallel degree)
    tp_size: int               # the tensor-parallel degree (1: none)
    schedule: Callable[[int], float]  # step -> LR
    total_steps: int | None    # the run's horizon (``fit`` sets it; checkpoints record it)
    zero: Any                  # the ZeRO shards' keeper (None at stage 0 without tensor parallelism)
    resumed_meta: dict | None  # the metadata of the checkpoint resumed from (None: a fresh start)
    resumed_path: Path | None  # and its path

    def train_micro_batch(self, batch: Any, defer: bool = False) -> Any: ...

    def finish_step(self, result: Any, sums: dict) -> tuple[StepResult, dict[str, float]]:
        """A step's outcome (what ``train_micro_batch(..., defer=True)`` returned) and this rank's
        metric sums (framework scalars) on the host, read in one transfer; the step counted."""

    def finish_steps(self, steps: list) -> list[tuple[StepResult, dict[str, float]]]:
        """``finish_step`` of several ``(result, sums)`` in order, in one transfer."""

    def average(self, value: float, name: str = "metric") -> float:
        """The mean of a scalar over ranks (a collective)."""

    def any_rank(self, flag: bool, name: str) -> bool:
        """True on every rank when ``flag`` is true on any (a collective)."""

    def install_stop_handler(self) -> None: ...

    def should_stop(self) -> bool: ...

    def save(self, folder: str | Path, data_state: Any = None, keep: int = 3) -> Path | None: ...

    def wait_for_save(self) -> None:
        """A background save on disk, or its error raised on every rank (a collective)."""

    def abandon_save(self) -> Path | None:
        """The world changed under a background save (a Horovod elastic reset): stop waiting for
        it without the old world's collectives; returns the checkpoint it left incomplete, or None
        (a collective of the new world)."""

    def memory(self) -> dict:
        """What this rank holds, in bytes, and its peak so far (``memory_line``)."""

    def resume(self, folder: str | Path | None) -> Any: ...

    def set_plan(self, plan: BatchPlan, schedule: Callable[[int], float]) -> None:
        """A new batch layout on the same ranks, the LR from ``schedule`` from here on."""

    # Horovod elastic (``train.elastic``'s hook)
    def snapshot(self) -> Any:
        """The training state in host memory: what an elastic commit keeps."""

    def restore_snapshot(self, snap: Any) -> None:
        """Back to a :meth:`snapshot`, with no gradients pending."""

    def sync(self) -> None:
        """Rank 0's state on every rank of a new world (a collective)."""

    def resize(self, plan: BatchPlan | None, schedule: Callable[[int], float] | None) -> None:
        """This world's rank and size from Horovod and, given a plan, its batch layout."""


# ---------------------------------------------------------------------- construction
def check_engine_args(backward_passes_per_step: int, compression: str, precision):
    """The arguments both engines validate the same way; returns the PrecisionConfig."""
    from hvd_bert.config import PrecisionConfig

    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    if compression not in ("none", "fp16"):
        raise ValueError(f"compression must be 'none' or 'fp16', got {compression!r}")
    return precision if isinstance(precision, PrecisionConfig) else PrecisionConfig(mode=precision)


def engine_settings(cfg, world_size: int) -> tuple[BatchPlan, float, dict]:
    """``(plan, peak_lr, engine keyword arguments)`` of a ``TrainConfig`` on ``world_size``
    ranks: the batch plan, the peak LR scaled to the global batch, and the schedule,
    accumulation, compression, precision and clipping both engines take (NVLAMB clips inside
    the optimizer, so the engine does not)."""
    from hvd_bert.core.schedules import make_schedule

    plan = cfg.batch.plan(world_size)
    peak = cfg.optim.peak_lr(plan.global_batch_size)
    return plan, peak, dict(
        schedule=make_schedule(cfg.schedule, peak), backward_passes_per_step=plan.backward_passes_per_step,
        compression=cfg.horovod.compression, gradient_predivide_factor=cfg.horovod.gradient_predivide_factor,
        precision=cfg.precision,
        max_grad_norm=None if cfg.optim.name == "nvlamb" else cfg.optim.max_grad_norm,
        resume_resized=cfg.resume_resized, zero_stage=cfg.zero.stage, zero_bucket_mb=cfg.zero.bucket_mb)


# ---------------------------------------------------------------------- checkpoint metadata
def checkpoint_meta(engine: Engine, data_state: Any, rng_of_ranks: list) -> dict:
    """The metadata both frameworks write beside the tensors of a checkpoint (plain JSON)."""
    plan = engine.plan
    return {"format": META_FORMAT, "step": engine.step_count, "micro_step": engine.micro_step,
            "skipped_steps": engine.skipped_steps, "data": data_state, "world_size": engine.world_size,
            # the data-parallel replicas (world size / train.tensor_parallel): what reads the data
            "data_parallel_size": engine.data_size,
            "backward_passes_per_step": engine.k,
            "local_batch_size": plan.local_batch_size if plan else None,
            "global_batch_size": plan.global_batch_size if plan else None,
            # an elastic run's configured global batch (its plan may be the nearest one)
            "target_global_batch_size": engine.target_global_batch,
            # the run's horizon, so that a resume can say what changed (fit sets it)
            "total_steps": engine.total_steps,
            # the optimizer whose state the file holds (another cannot take it over)
            "optimizer": _optimizer_name(engine),
            "rng": rng_of_ranks}


def _optimizer_name(engine) -> str | None:
    return engine.config.optim.name if engine.config is not None else None


def check_resume(meta: dict, path: str | Path, *, world_size: int, plan: BatchPlan | None,
                 allow_resized: bool, target: int | None = None, optimizer: str | None = None) -> None:
    """Refuse a checkpoint whose world size or global batch differs from this run's, naming
    the choices; ``allow_resized`` (``train.resume_resized``) accepts another world size when
    the global batch is the same."""
    if meta.get("format") != META_FORMAT:
        raise CheckpointError(f"{path} has checkpoint metadata format {meta.get('format')!r}, this "
                              f"hvd_bert reads {META_FORMAT}; start a new run (another train.output_dir)")
    bad = meta_fault(meta, path)
    if bad:
        raise CheckpointError(f"{path} is damaged: its metadata {bad}; delete it to resume from the "
                              f"checkpoint before, or restore it from a copy")
    old_g = meta.get("target_global_batch_size") or meta.get("global_batch_size")
    new_g = target or (plan.global_batch_size if plan else None)
    if old_g is not None and new_g is not None and old_g != new_g:
        raise ResumeError(f"{path} was written with a global batch of {old_g}, this run has {new_g}: "
                          f"resuming would change the recipe; {_batch_fix(old_g, plan)}, or start a new "
                          f"run in another train.output_dir")
    if meta.get("optimizer") and optimizer and meta["optimizer"] != optimizer:
        raise ResumeError(f"{path} holds the state of optimizer {meta['optimizer']}, this run uses "
                          f"{optimizer}: its state cannot be taken over; --set "
                          f"train.optim.name={meta['optimizer']}, or start a new run in another "
                          f"train.output_dir")
    old = meta.get("data_parallel_size", meta["world_size"])
    if old != world_size and not allow_resized:
        raise ResumeError(f"{path} was written by {old} data-parallel replica{'s' if old != 1 else ''} "
                          f"({meta['world_size']} ranks, k={meta['backward_passes_per_step']}), this run has "
                          f"{world_size}: the global batch is the same, but every rank's data share and RNG "
                          f"stream change; to go on anyway --set train.resume_resized=true, or start a new "
                          f"run in another train.output_dir")


def _batch_fix(old_g: int, plan: BatchPlan | None) -> str:
    """Settings that make the global batch ``old_g`` on this run's data-parallel ranks (a local
    batch no larger than this run's, the accumulation derived), or the rank counts that can."""
    from hvd_bert.core.batch import largest_divisor_at_most

    if plan is None:
        return f"give train.batch settings that make {old_g}"
    d = plan.world_size
    if old_g % d:
        fits = [n for n in range(1, 2 * d + 1) if not old_g % n]
        return (f"no local batch on {d} data-parallel ranks makes {old_g}: start ranks whose data-parallel "
                f"replicas number one of {fits[-4:]} (world size / train.tensor_parallel)")
    local = largest_divisor_at_most(old_g // d, plan.local_batch_size)
    return (f"--set train.batch.global_batch_size={old_g} --set train.batch.local_batch_size={local} make it "
            f"({local} x backward_passes_per_step {old_g // d // local} x {d} data-parallel "
            f"rank{'s' if d != 1 else ''})")


def meta_fault(meta: dict, path: str | Path) -> str | None:
    """What is wrong with the metadata :func:`checkpoint_meta` wrote (a checkpoint is untrusted
    input: a resume must not loop, allocate or count from a value it cannot hold), or None. A
    checkpoint named ``ckpt-<N>`` must say step N."""
    from hvd_bert.train.checkpoint import checkpoint_step

    def count(key, low=0):
        v = meta.get(key)
        return isinstance(v, int) and not isinstance(v, bool) and low <= v < 2**62

    for key, low in (("step", 0), ("micro_step", 0), ("skipped_steps", 0), ("world_size", 1),
                     ("backward_passes_per_step", 1)):
        if not count(key, low):
            return f"has {key}={meta.get(key)!r}, not a count" + ("" if key in meta else " (it is missing)")
    for key in ("data_parallel_size", "local_batch_size", "global_batch_size", "target_global_batch_size",
                "total_steps"):
        if meta.get(key) is not None and not count(key, 1):
            return f"has {key}={meta.get(key)!r}, not a count"
    dp = meta.get("data_parallel_size")
    if dp is not None and meta["world_size"] % dp:  # (the replicas: world size / tensor-parallel degree)
        return f"has data_parallel_size={dp}, which does not divide its world_size={meta['world_size']}"
    if "data" not in meta:
        return "has no data position"
    # every optimizer step, applied or skipped, read at most a global batch's micro-batches (k
    # of any layout the run had is at most its global batch): a resume reads up to here
    k_most = max(meta.get("global_batch_size") or 1, meta["backward_passes_per_step"] * meta["world_size"])
    most = (meta["step"] + meta["skipped_steps"] + 1) * k_most
    if meta["micro_step"] > most:
        return (f"has micro_step={meta['micro_step']}, more micro-batches than its "
                f"{meta['step'] + meta['skipped_steps']} steps can have read")
    data = meta["data"]  # (the loop's {micro_step}, an elastic run's {micro_step, samples})
    if data is not None and not (isinstance(data, dict) and all(
            isinstance(data[k], int) and not isinstance(data[k], bool) and 0 <= data[k] < 2**62
            for k in ("micro_step", "samples") if k in data)):
        return f"has the data position {data!r}, not counts of micro-batches and samples"
    if data is not None and data.get("micro_step", 0) > most:
        return (f"has the data position micro_step={data['micro_step']}, more micro-batches than its "
                f"{meta['step'] + meta['skipped_steps']} steps can have read")
    rng = meta.get("rng")  # (every checkpoint holds each rank's random state: a resume repeats them)
    if not (isinstance(rng, list) and len(rng) == meta["world_size"]):
        held = len(rng) if isinstance(rng, list) else "no list of"
        return f"holds {held} random states for its {meta['world_size']} ranks"
    n = checkpoint_step(path)
    if n is not None and n != meta["step"]:
        return f"says step {meta['step']}, its name step {n}"
    return None


def kept_global_batch(meta: dict, engine) -> BatchPlan | None:
    """A resume under a new layout keeps the checkpoint's global batch (its recipe): when this run
    did not give ``train.batch.global_batch_size`` and its layout makes another global batch,
    the plan with this run's local batch and the ``backward_passes_per_step`` that makes the
    checkpoint's on this run's data-parallel replicas. None when the global batch is the same,
    when it was given, or when no whole k makes it (then :func:`check_resume` refuses)."""
    plan, config = engine.plan, engine.config
    old = meta.get("target_global_batch_size") or meta.get("global_batch_size")
    if plan is None or config is None or not isinstance(old, int) or old == plan.global_batch_size \
            or not engine.keep_checkpoint_batch:
        return None
    if config.batch.global_batch_size is not None or engine.target_global_batch:
        return None
    per = plan.local_batch_size * plan.world_size
    return BatchPlan(plan.local_batch_size, old // per, plan.world_size) if old % per == 0 else None


def resume_on_rank0(engine: Engine, folder: str | Path | None, suffix: str | tuple[str, ...], *,
                    read_meta: Callable[[Path], dict], load: Callable[[Path], None],
                    broadcast_object: Callable[[Any, str], Any], allow_resized: bool) -> dict | None:
    """The resume protocol of both engines: rank 0 finds the newest ``ckpt-*.<suffix>`` in
    ``folder`` (of any of the suffixes given; or takes the file/folder given), reads and checks
    its metadata, then loads its tensors (``load``); the outcome, an error included, is
    broadcast, so every rank raises the same error or gets the same metadata. The engine then
    broadcasts the tensors itself (or, a sharded checkpoint, every rank reads its own:
    ``engine.resumed_path`` says which checkpoint)."""
    out = None
    if engine.rank == 0 and folder is not None:
        p = Path(folder)
        # a checkpoint file, or a checkpoint folder (TensorFlow's), not a run folder called ckpt-0
        suffixes = (suffix,) if isinstance(suffix, str) else suffix
        given = p.is_file() or (p.is_dir() and any(is_checkpoint_name(p, s) for s in suffixes))
        if p.is_dir() and not given:
            remove_stale_temporaries(p)  # what a writer killed mid-checkpoint left
        path = p if given else latest_checkpoint(p, suffix)
        if path is not None:
            try:
                meta = read_meta(path)
                kept = kept_global_batch(meta, engine)
                check_resume(meta, path, world_size=engine.data_size,
                             plan=kept or engine.plan, allow_resized=allow_resized,
                             target=engine.target_global_batch, optimizer=_optimizer_name(engine))
                load(path)
                out = {"meta": meta, "path": str(path),
                       "plan": [kept.local_batch_size, kept.backward_passes_per_step, kept.world_size]
                       if kept else None}
            except (CheckpointError, ResumeError) as e:
                out = {"error": str(e), "kind": type(e).__name__}
            except Exception as e:  # noqa: BLE001  (reported on every rank below)
                out = {"error": f"cannot read checkpoint {path}: {type(e).__name__}: {e}; delete it to "
                                f"resume from the one before, or start afresh in another train.output_dir",
                       "kind": "CheckpointError"}
    # Horovod: name every broadcast_object (its default name is the object's type, which
    # differs between rank 0 and the others, and would hang).
    out = broadcast_object(out, "hvd_bert.resume")
    if out is None:
        return None
    if "error" in out:
        raise (ResumeError if out["kind"] == "ResumeError" else CheckpointError)(out["error"])
    meta = out["meta"]
    if out.get("plan"):  # the checkpoint's global batch, on this layout (every rank the same plan)
        from hvd_bert.core.schedules import make_schedule

        plan = BatchPlan(*out["plan"])
        engine.set_plan(plan, make_schedule(engine.config.schedule,
                                            engine.config.optim.peak_lr(plan.global_batch_size)))
    engine.resumed_meta = meta  # (what the resume line compares with)
    engine.resumed_path = Path(out["path"])
    engine.step_count, engine.skipped_steps = meta["step"], meta["skipped_steps"]
    # The data position: every rank has read step_count * k micro-batches (k of this run).
    engine.micro_step = meta["micro_step"] if meta["world_size"] == engine.world_size else \
        meta["step"] * engine.k
    return meta


def host_rng_state() -> dict:
    """numpy's and Python's global RNG states as plain JSON values (for :func:`checkpoint_meta`)."""
    import random

    import numpy as np

    np_state, py_state = np.random.get_state(), random.getstate()
    return {"numpy": [np_state[0], np_state[1].tolist(),
                      *[float(x) if isinstance(x, float) else int(x) for x in np_state[2:]]],
            "python": [py_state[0], list(py_state[1]), py_state[2]]}


def set_host_rng_state(state: dict) -> None:
    """Restore what :func:`host_rng_state` returned."""
    import random

    import numpy as np

    n, p = state["numpy"], state["python"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), *n[2:]))
    random.setstate((p[0], tuple(p[1]), p[2]))


def rng_for_rank(meta: dict, rank: int, world_size: int) -> Any:
    """This rank's saved RNG state, or None when the world size changed."""
    if meta.get("world_size") != world_size or not meta.get("rng"):
        return None
    return meta["rng"][rank]


def refuse_nonfinite(engine, bad: list[str]) -> None:
    """A resumed state whose weights, optimizer state or loss scale hold NaN or infinite values
    (``bad``: their names on this rank) is a damaged checkpoint, said on every rank before a
    step could blame the run for diverging (a collective)."""
    if engine.any_rank(bool(bad), "hvd_bert.resume.finite"):
        where = f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}" if bad else "another rank's share"
        raise CheckpointError(f"checkpoint {engine.resumed_path} holds NaN or infinite values ({where}); "
                              f"delete it to resume from the one before, or start afresh in another "
                              f"train.output_dir")


def restore_rng(engine, meta: dict, set_state: Callable[[Any], None]) -> None:
    """This rank's saved RNG state restored by ``set_state`` (the framework's), when the world
    size is the checkpoint's; a state that does not restore is a damaged checkpoint, said on
    every rank (a collective: ``engine.any_rank``)."""
    rng = rng_for_rank(meta, engine.rank, engine.world_size)
    fault = None
    if rng is not None:
        try:
            set_state(rng)
        except Exception as e:  # noqa: BLE001  (any damage: a wrong length, type or value)
            fault = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if engine.any_rank(fault is not None, "hvd_bert.resume.rng"):
        raise CheckpointError(
            f"checkpoint {engine.resumed_path} holds a random state that does not restore"
            f"{' on rank ' + str(engine.rank) + ' (' + fault + ')' if fault else ' on another rank'}; "
            f"delete it to resume from the one before, or start afresh in another train.output_dir")
