"""Keras ``model.fit`` with Horovod: the optimizer wrapper and the toolkit's callbacks.

    opt = distributed_optimizer(build_optimizer(cfg.optim, lr), backward_passes_per_step=k)
    model.compile(optimizer=opt, loss=...)
    start = restore_for_fit(model, output_dir)      # micro-batches done by an earlier run
    model.fit(ds.skip(start), verbose=verbose(), callbacks=fit_callbacks(
        schedule, k, global_batch, output_dir, initial_micro_step=start))

* :class:`BroadcastCallback` creates the optimizer state explicitly and broadcasts model and
  optimizer variables from rank 0 before the first batch (Horovod's own callback broadcasts
  after the first batch, so the first update is computed from unsynchronised weights).
* :class:`ScheduleCallback` sets the LR before every batch from any ``hvd_bert.core.schedules``
  schedule, counting optimizer steps from the micro-batch counter (Horovod's LR callbacks
  assume epoch-based warmup and break on optimizers whose momentum is a float).
* Horovod's ``MetricAverageCallback`` averages the epoch metrics over ranks.
* :class:`ThroughputCallback` logs samples/s on rank 0; :class:`CheckpointCallback` writes
  atomic rank-0 checkpoints; :func:`restore_for_fit` resumes from the newest.
"""

from __future__ import annotations

import time
from pathlib import Path

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

from hvd_bert.core.batch import optimizer_steps_done
from hvd_bert.train.checkpoint import latest_checkpoint
from hvd_bert.core.schedules import Schedule
from hvd_bert.tf import check_keras
from hvd_bert.tf.checkpoint import CKPT_SUFFIX, restore_checkpoint, save_checkpoint

check_keras()
keras = tf.keras

__all__ = ["distributed_optimizer", "BroadcastCallback", "ScheduleCallback", "ThroughputCallback",
           "CheckpointCallback", "restore_for_fit", "fit_callbacks", "verbose"]


def verbose() -> int:
    """Keras ``verbose`` for ``fit``: a progress bar on rank 0 only."""
    return 1 if hvd.rank() == 0 else 0


def distributed_optimizer(optimizer, backward_passes_per_step: int = 1, compression: str = "none",
                          gradient_predivide_factor: float = 1.0, loss_scale: bool = False):
    """``hvd.DistributedOptimizer`` averaging the k accumulated micro-batch gradients, so k
    micro-batches of b equal one batch of k*b; with ``loss_scale`` (fp16), wrapped in Keras'
    dynamic ``LossScaleOptimizer``.

    The wrapping order is ``LossScaleOptimizer(hvd.DistributedOptimizer(opt))``: Horovod cannot
    rebuild a LossScaleOptimizer from its config. Then the overflow check sees the allreduced
    gradients only when every micro-batch is reduced (k = 1): with k > 1, Horovod hands back each
    rank's local sum on the other micro-batches, so ranks could disagree on the loss scale.
    """
    if loss_scale and backward_passes_per_step > 1:
        raise ValueError(
            f"fp16 loss scaling with backward_passes_per_step={backward_passes_per_step} in the "
            f"model.fit path would let ranks disagree on the loss scale (Keras checks each "
            f"micro-batch before Horovod's allreduce). Use hvd_bert.tf.engine.Engine (a custom "
            f"loop that checks after the allreduce), bf16, or backward_passes_per_step=1")
    opt = hvd.DistributedOptimizer(  # Horovod:
        optimizer, backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=True,
        compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
        gradient_predivide_factor=gradient_predivide_factor)
    return keras.mixed_precision.LossScaleOptimizer(opt) if loss_scale else opt


class BroadcastCallback(keras.callbacks.Callback):
    """Rank 0's model and optimizer variables to every rank before the first batch."""

    def on_train_begin(self, logs=None):
        if not self.model.built:
            raise RuntimeError("build the model before fit (call it on a batch, or give the first "
                               "layer an input_shape): its variables must exist to be broadcast")
        opt = self.model.optimizer
        # Create the optimizer's state now: broadcasting it needs it, and no step is taken.
        opt.build(self.model.trainable_variables)
        hvd_tf.broadcast_variables(self.model.variables, root_rank=0)  # Horovod:
        hvd_tf.broadcast_variables(opt.variables(), root_rank=0)  # Horovod:


class ScheduleCallback(keras.callbacks.Callback):
    """Set the LR before every batch to ``schedule(optimizer step + 1)``, the optimizer step
    derived from the micro-batch counter (k micro-batches per step)."""

    def __init__(self, schedule: Schedule, backward_passes_per_step: int = 1, initial_micro_step: int = 0):
        super().__init__()
        self.schedule, self.k, self.micro_step = schedule, backward_passes_per_step, initial_micro_step
        self.last_lr = float("nan")

    def on_train_batch_begin(self, batch, logs=None):
        self.last_lr = float(self.schedule(optimizer_steps_done(self.micro_step, self.k) + 1))
        self.model.optimizer.learning_rate.assign(self.last_lr)

    def on_train_batch_end(self, batch, logs=None):
        self.micro_step += 1


class ThroughputCallback(keras.callbacks.Callback):
    """Rank 0 logs loss, LR and samples/s every ``log_every`` optimizer steps."""

    def __init__(self, global_batch_size: int, backward_passes_per_step: int = 1, log_every: int = 10,
                 schedule_cb: ScheduleCallback | None = None, log=print, initial_micro_step: int = 0):
        super().__init__()
        self.global_batch, self.k, self.log_every = global_batch_size, backward_passes_per_step, log_every
        self.schedule_cb, self.log, self.history = schedule_cb, log, []
        # A resumed fit counts on from the checkpoint's step.
        self._micro, self._t0 = initial_micro_step, None
        self._steps, self._since = optimizer_steps_done(initial_micro_step, backward_passes_per_step), 0

    def on_train_batch_end(self, batch, logs=None):
        if self._t0 is None:
            self._t0 = time.perf_counter()
        self._micro += 1
        if self._micro % self.k:
            return
        self._steps += 1
        self._since += 1
        if self._steps % self.log_every == 0 and hvd.rank() == 0:
            dt = time.perf_counter() - self._t0
            sps = self.global_batch * self._since / dt if dt > 0 else float("nan")
            self._since = 0
            lr = self.schedule_cb.last_lr if self.schedule_cb else float("nan")
            loss = float((logs or {}).get("loss", float("nan")))
            self.history.append(dict(step=self._steps, loss=loss, lr=lr, samples_per_s=sps))
            self.log(f"step {self._steps:>6} | loss {loss:.4f} (rank 0 running mean) | lr {lr:.3e} | "
                     f"{sps:,.1f} samples/s")
            self._t0 = time.perf_counter()


class CheckpointCallback(keras.callbacks.Callback):
    """Rank 0 writes ``folder/ckpt-<step>.tf`` atomically every ``every`` optimizer steps and at
    the end of training, keeping the newest ``keep``."""

    def __init__(self, folder: str | Path, backward_passes_per_step: int = 1, every: int = 0,
                 keep: int = 3, initial_micro_step: int = 0):
        super().__init__()
        self.folder, self.k, self.every, self.keep = Path(folder), backward_passes_per_step, every, keep
        self.micro_step = initial_micro_step
        self.saved_step = -1

    def _save(self):
        step = optimizer_steps_done(self.micro_step, self.k)
        if hvd.rank() == 0 and step != self.saved_step:
            save_checkpoint(self.folder, step, dict(model=self.model, optimizer=self.model.optimizer),
                            self.keep, meta={"step": step, "micro_step": self.micro_step})
        self.saved_step = step

    def on_train_batch_end(self, batch, logs=None):
        self.micro_step += 1
        if self.every and self.micro_step % (self.every * self.k) == 0:
            self._save()

    def on_train_end(self, logs=None):
        self._save()


def restore_for_fit(model, folder: str | Path | None) -> int:
    """Restore the newest checkpoint in ``folder`` into ``model`` and its compiled optimizer on
    rank 0 (every rank then receives it from :class:`BroadcastCallback`). Returns the
    micro-batches already consumed (0 without a checkpoint), on every rank."""
    opt = model.optimizer
    opt.build(model.trainable_variables)
    micro = 0
    if hvd.rank() == 0 and folder is not None:
        found = latest_checkpoint(folder, CKPT_SUFFIX)
        if found is not None:
            micro = int(restore_checkpoint(found, dict(model=model, optimizer=opt))["micro_step"])
    return int(hvd_tf.broadcast_object(micro, root_rank=0, name="hvd_bert.fit.resume"))  # Horovod:


def fit_callbacks(schedule: Schedule, backward_passes_per_step: int, global_batch_size: int,
                  output_dir: str | Path | None = None, checkpoint_every: int = 0, keep: int = 3,
                  log_every: int = 10, initial_micro_step: int = 0) -> list:
    """The callbacks in the order they must run: broadcast, LR, metric averaging (before any
    logging), throughput, checkpoints."""
    sched = ScheduleCallback(schedule, backward_passes_per_step, initial_micro_step)
    cbs = [BroadcastCallback(), sched,
           hvd.callbacks.MetricAverageCallback(),  # Horovod:
           ThroughputCallback(global_batch_size, backward_passes_per_step, log_every, sched,
                              initial_micro_step=initial_micro_step)]
    if output_dir is not None:
        cbs.append(CheckpointCallback(output_dir, backward_passes_per_step, checkpoint_every, keep,
                                      initial_micro_step))
    return cbs
