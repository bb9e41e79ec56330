"""Horovod integration for TensorFlow custom training loops (``tf.GradientTape``).

``hvd.DistributedGradientTape`` has no gradient accumulation; this engine provides it with the
same option names as the PyTorch frontend:

    engine = Engine(model, optimizer, loss_fn, schedule=..., backward_passes_per_step=k)
    for batch in batches:
        result = engine.train_micro_batch(batch)   # a StepResult on the k-th, else None

Per optimizer step: k micro-batches are back-propagated and their gradients accumulated
locally (each divided by k, so k micro-batches of b equal one batch of k*b); then ONE grouped
allreduce (optionally fp16-compressed), unscaling, an inf/NaN check on the reduced
gradients (the same buffer on every rank, so every rank makes the same skip decision),
optional global-norm clipping, the LR from the schedule, and one ``apply_gradients``.
Mixed precision uses a ``mixed_float16`` / ``mixed_bfloat16`` Keras policy; fp16 adds
dynamic loss scaling (GradScaler's defaults); a skipped step does not advance the schedule.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf
import horovod.tensorflow as hvd

from hvd_bert.cluster import check_launch, check_world
from hvd_bert.common.batch import is_sync_step
from hvd_bert.common.checkpoint import checkpoint_path, latest_checkpoint, list_checkpoints
from hvd_bert.common.config import PrecisionConfig, TrainConfig, make_schedule
from hvd_bert.common.runlog import MetricWindow, RunLog, StepBook, StopSignal
from hvd_bert.common.schedules import Schedule
from hvd_bert.tf import check_keras
from hvd_bert.tf.optim import build_optimizer

check_keras()

__all__ = ["Engine", "StepResult", "fit", "FitResult", "set_precision_policy", "save_checkpoint",
           "restore_checkpoint"]

CKPT_SUFFIX = "tf"


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did (identical on every rank)."""

    step: int
    lr: float
    skipped: bool
    grad_norm: float
    loss_scale: float
    loss: float  # this rank's mean micro-batch loss over the window


def set_precision_policy(mode: str) -> None:
    """Set Keras' global mixed-precision policy for ``fp32`` / ``fp16`` / ``bf16`` (call it
    before building the model)."""
    policy = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[mode]
    tf.keras.mixed_precision.set_global_policy(policy)


def _ensure_init() -> None:
    if not hvd.is_initialized():
        check_launch()  # plain `srun` without --mpi=pmix: say so before MPI aborts
        hvd.init()  # Horovod:
        check_world(hvd.size())


class Engine:
    """Distributed custom-loop training of one Keras model (see the module docstring).

    Args:
        model: a built Keras model (its variables are broadcast from rank 0).
        optimizer: a tf-keras optimizer (not wrapped in hvd.DistributedOptimizer).
        loss_fn: ``loss_fn(model, batch) -> scalar mean loss`` of one micro-batch.
        schedule, backward_passes_per_step, compression, gradient_predivide_factor,
        precision, max_grad_norm: as in ``hvd_bert.pt.engine.Engine``.
        jit_compile: compile the micro-batch step with XLA.
    """

    def __init__(self, model: tf.keras.Model, optimizer, loss_fn: Callable[[tf.keras.Model, Any], tf.Tensor],
                 *, schedule: Schedule, backward_passes_per_step: int = 1, compression: str = "none",
                 gradient_predivide_factor: float = 1.0, precision: str | PrecisionConfig = "fp32",
                 max_grad_norm: float | None = None, jit_compile: bool = False):
        _ensure_init()
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        if compression not in ("none", "fp16"):
            raise ValueError(f"compression must be 'none' or 'fp16', got {compression!r}")
        pcfg = precision if isinstance(precision, PrecisionConfig) else PrecisionConfig(mode=precision)
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.schedule, self.k, self.precision = schedule, backward_passes_per_step, pcfg
        self.max_grad_norm = max_grad_norm
        self.compression = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        self.predivide = float(gradient_predivide_factor)
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.stop_signal = StopSignal()
        self.last_loss, self.last_metrics = None, {}
        self.step_count = 0
        self.micro_step = 0
        self.skipped_steps = 0
        self.variables = list(model.trainable_variables)
        if not self.variables:
            raise ValueError("the model has no trainable variables: build it (call it on a batch) first")
        # Create the optimizer state explicitly (no fake step), then broadcast everything.
        optimizer.build(self.variables)
        self.accumulators = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]
        self.loss_scale = tf.Variable(pcfg.init_scale if pcfg.mode == "fp16" else 1.0, dtype=tf.float32,
                                      trainable=False)
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._window_loss = tf.Variable(0.0, dtype=tf.float32, trainable=False)
        self._micro = tf.function(self._micro_impl, jit_compile=jit_compile)
        self._apply = tf.function(self._apply_impl)
        self.broadcast()

    @classmethod
    def from_config(cls, model, loss_fn, cfg: TrainConfig, jit_compile: bool = False) -> Engine:
        _ensure_init()
        plan = cfg.batch.plan(hvd.size())
        peak = cfg.optim.peak_lr(plan.global_batch_size)
        clip = None if cfg.optim.name == "nvlamb" else cfg.optim.max_grad_norm
        engine = cls(model, build_optimizer(cfg.optim, lr=peak), loss_fn,
                     schedule=make_schedule(cfg.schedule, peak),
                     backward_passes_per_step=plan.backward_passes_per_step,
                     compression=cfg.horovod.compression,
                     gradient_predivide_factor=cfg.horovod.gradient_predivide_factor,
                     precision=cfg.precision, max_grad_norm=clip, jit_compile=jit_compile)
        engine.plan = plan
        return engine

    def broadcast(self) -> None:
        """Every rank takes rank 0's model and optimizer variables (and loss scale)."""
        hvd.broadcast_variables(self.model.variables, root_rank=0)  # Horovod:
        hvd.broadcast_variables(self.optimizer.variables(), root_rank=0)  # Horovod:
        hvd.broadcast_variables([self.loss_scale, self.good_steps], root_rank=0)  # Horovod:

    # ------------------------------------------------------------------ the step
    def _micro_impl(self, batch):
        with tf.GradientTape() as tape:
            out = self.loss_fn(self.model, batch)
            loss, metrics = out if isinstance(out, tuple) else (out, {})
            loss = tf.cast(loss, tf.float32)
            # dividing by k makes the k accumulated micro-batch gradients their mean
            scaled = loss * self.loss_scale / self.k
        grads = tape.gradient(scaled, self.variables)
        for acc, g in zip(self.accumulators, grads):
            if g is not None:
                acc.assign_add(tf.cast(tf.convert_to_tensor(g), acc.dtype))
        self._window_loss.assign_add(loss / self.k)
        return loss, metrics

    def _apply_impl(self, lr):
        # Horovod: one grouped allreduce of the accumulated gradients of this window.
        if self.predivide != 1.0:
            grads = hvd.grouped_allreduce(
                [a.read_value() for a in self.accumulators], op=hvd.Sum, compression=self.compression,
                prescale_factor=1.0 / self.predivide, postscale_factor=self.predivide / self.world_size)
        else:
            grads = hvd.grouped_allreduce([a.read_value() for a in self.accumulators], op=hvd.Average,
                                          compression=self.compression)
        grads = [g / self.loss_scale for g in grads]
        # Checked after the allreduce: every rank sees the same buffer and decides the same.
        norm = tf.linalg.global_norm(grads)
        finite = tf.math.is_finite(norm)
        if self.max_grad_norm is not None:
            grads, _ = tf.clip_by_global_norm(grads, self.max_grad_norm, use_norm=norm)
        self.optimizer.learning_rate.assign(lr)

        def apply():
            self.optimizer.apply_gradients(zip(grads, self.variables))
            return tf.constant(True)

        tf.cond(finite, apply, lambda: tf.constant(False))
        if self.precision.mode == "fp16":
            p = self.precision
            grow = tf.logical_and(finite, self.good_steps + 1 >= p.growth_interval)
            self.loss_scale.assign(tf.where(finite, tf.where(grow, self.loss_scale * p.growth_factor,
                                                             self.loss_scale),
                                            self.loss_scale * p.backoff_factor))
            self.good_steps.assign(tf.where(tf.logical_and(finite, tf.logical_not(grow)),
                                            self.good_steps + 1, tf.zeros_like(self.good_steps)))
        for a in self.accumulators:
            a.assign(tf.zeros_like(a))
        window_loss = self._window_loss.read_value()
        self._window_loss.assign(0.0)
        return finite, norm, self.loss_scale.read_value(), window_loss

    def train_micro_batch(self, batch) -> StepResult | None:
        """Back-propagate one micro-batch; on the k-th, reduce and apply (returns the result).
        The micro-batch's loss and the metrics ``loss_fn`` returned (when it returns
        ``(loss, metrics)``) are in ``last_loss`` / ``last_metrics`` as tensors."""
        self.last_loss, self.last_metrics = self._micro(batch)
        sync = is_sync_step(self.micro_step, self.k)
        self.micro_step += 1
        if not sync:
            return None
        lr = float(self.schedule(self.step_count + 1))
        finite, norm, scale, loss = self._apply(tf.constant(lr, tf.float32))
        finite = bool(finite)
        if finite:
            self.step_count += 1
        else:
            self.skipped_steps += 1
        return StepResult(self.step_count, lr, not finite, float(norm), float(scale), float(loss))

    def average(self, value: float, name: str = "metric") -> float:
        """Mean of a scalar over ranks (a collective)."""
        return float(hvd.allreduce(tf.constant([float(value)]), op=hvd.Average, name=name)[0])

    def install_stop_handler(self, signals=(signal.SIGTERM, signal.SIGUSR1)) -> None:
        """On SIGTERM (what SLURM sends before a time limit), finish the current step, save a
        checkpoint and stop: :meth:`should_stop` turns true on every rank together."""
        self.stop_signal.install(signals)

    def should_stop(self) -> bool:
        """Whether any rank received a stop signal (a collective: every rank must call it)."""
        flag = tf.constant([1.0 if self.stop_signal.requested else 0.0])
        return bool(hvd.allreduce(flag, op=hvd.Max, name="hvd_bert.stop")[0] > 0)  # Horovod:

    # ------------------------------------------------------------------ checkpoints
    def save(self, folder: str | Path, data_state: Any = None, keep: int = 3) -> Path | None:
        """Atomic rank-0 checkpoint ``folder/ckpt-<step>.tf/`` (a collective)."""
        path = None
        if self.rank == 0:
            path = save_checkpoint(folder, self.step_count, self._trackables(), keep, meta={
                "step": self.step_count, "micro_step": self.micro_step,
                "skipped_steps": self.skipped_steps, "data": data_state})
        # Horovod: a barrier (TF has none): nobody goes on before rank 0 has written.
        hvd.allreduce(tf.constant(0.0), name="hvd_bert.barrier.save")
        return path

    def resume(self, folder: str | Path | None) -> Any:
        """Restore the newest checkpoint on rank 0 and broadcast it (a collective)."""
        meta = None
        if self.rank == 0 and folder is not None:
            found = latest_checkpoint(folder, CKPT_SUFFIX)
            if found is not None:
                meta = restore_checkpoint(found, self._trackables())
        meta = hvd.broadcast_object(meta, root_rank=0, name="hvd_bert.resume.meta")  # Horovod:
        if meta is None:
            return None
        self.broadcast()
        self.step_count, self.micro_step = meta["step"], meta["micro_step"]
        self.skipped_steps = meta["skipped_steps"]
        return meta["data"]

    def _trackables(self) -> dict:
        return dict(model=self.model, optimizer=self.optimizer, loss_scale=self.loss_scale,
                    good_steps=self.good_steps)


def save_checkpoint(folder: str | Path, step: int, trackables: dict, keep: int = 3,
                    meta: dict | None = None) -> Path:
    """Write ``tf.train.Checkpoint(**trackables)`` and ``meta.json`` into a temporary folder,
    then rename it to ``folder/ckpt-<step>.tf`` (atomic: no half-written checkpoint under a
    final name). Keeps the newest ``keep``."""
    final = checkpoint_path(folder, step, CKPT_SUFFIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        _rmtree(tmp)
    tf.train.Checkpoint(**trackables).write(str(tmp / "ckpt"))
    (tmp / "meta.json").write_text(json.dumps(meta or {}))
    if final.exists():
        _rmtree(final)
    tmp.rename(final)
    for _, old in list_checkpoints(folder, CKPT_SUFFIX)[:-keep]:
        _rmtree(old)
    return final


def restore_checkpoint(path: str | Path, trackables: dict) -> dict:
    """Restore a checkpoint written by :func:`save_checkpoint`; returns its meta."""
    path = Path(path)
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise RuntimeError(f"checkpoint {path} is incomplete (no meta.json); delete it to resume "
                           f"from the one before")
    try:
        tf.train.Checkpoint(**trackables).read(str(path / "ckpt")).assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as e:
        raise RuntimeError(f"cannot restore checkpoint {path}: {e}; it was written for another "
                           f"model or optimizer, or is corrupt") from None
    return json.loads(meta_file.read_text())


def _rmtree(p: Path) -> None:
    import shutil
    shutil.rmtree(p, ignore_errors=True)



# ---------------------------------------------------------------------- the loop helper
@dataclass
class FitResult:
    steps: int
    skipped_steps: int
    last_loss: float
    checkpoint: Path | None
    stopped_early: bool  # by a signal or by on_step
    history: list
    stopped_by_signal: bool = False


def fit(engine: Engine, batches_from: Callable[[int], Any], *, total_steps: int,
        output_dir: str | Path | None = None, checkpoint_every: int = 0, keep_checkpoints: int = 3,
        log_every: int = 10, progress: bool = True, log: Any = None, unit: str = "samples",
        on_step: Callable[[StepResult, dict], Any] | None = None) -> FitResult:
    """The custom-loop twin of ``hvd_bert.pt.engine.fit`` (same arguments, output and
    checkpoint/resume/SIGTERM behaviour); the loss function is the engine's ``loss_fn``."""
    plan = getattr(engine, "plan", None)
    if output_dir is not None:
        engine.resume(output_dir)
    own_log = log is None
    if own_log:
        log = RunLog(None, engine.rank, total_steps=total_steps, progress=progress,
                     line_keys=("loss", "lr", f"{unit}_per_s", "grad_norm"))
    log.set_step(engine.step_count)
    if plan is not None:
        log.print(f"batch: {plan.describe()}")  # printed once
    if engine.step_count and output_dir is not None:
        log.print(f"resumed from step {engine.step_count} in {output_dir}")
    engine.install_stop_handler()
    batches = iter(batches_from(engine.micro_step))
    window = MetricWindow(engine.k)
    book = StepBook(engine, log, plan=plan, total_steps=total_steps, log_every=log_every, unit=unit,
                    output_dir=output_dir, checkpoint_every=checkpoint_every,
                    keep_checkpoints=keep_checkpoints, on_step=on_step)
    while engine.step_count < total_steps:
        result = engine.train_micro_batch(next(batches))
        window.add({"loss": engine.last_loss, **engine.last_metrics})
        if result is not None and book.after_step(result, window.take()):
            break
    book.finish()
    if own_log:
        log.close()
    return FitResult(engine.step_count, engine.skipped_steps, book.last_loss, book.checkpoint, book.stopped,
                     log.history, book.by_signal)
