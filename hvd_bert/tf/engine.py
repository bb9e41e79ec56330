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

from pathlib import Path
from typing import Any, Callable

import numpy as np

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf
import horovod.tensorflow as hvd

from hvd_bert.core import zero as Z
from hvd_bert.core.batch import is_sync_step
from hvd_bert.config import ConfigError, PrecisionConfig, TrainConfig
from hvd_bert.train.engine import (FitResult, StepResult, check_engine_args,
                                   checkpoint_meta, engine_settings, host_rng_state,
                                   resume_on_rank0, refuse_nonfinite, restore_rng,
                                   set_host_rng_state)
from hvd_bert.train.loop import fit
from hvd_bert.train.memory import peak_host_bytes
from hvd_bert.train.checkpoint import checkpoint_format
from hvd_bert.train.sharded_writer import BackgroundSaves
from hvd_bert.train.elastic import launched_elastic
from hvd_bert.stop import STOP, STOP_SIGNALS
from hvd_bert.core.schedules import Schedule
from hvd_bert.tf import check_keras, init_horovod
from hvd_bert.tf.checkpoint import CKPT_SUFFIX, read_checkpoint_meta, restore_checkpoint, save_checkpoint
from hvd_bert.tf import sharded
from hvd_bert.train import sharded_checkpoint as S, sharded_state as SS
from hvd_bert.tf.optim import build_optimizer
from hvd_bert.tf.zero import ShardedState

check_keras()  # hvd_bert.tf also switched Keras to generator-based dropout (saved in checkpoints)

__all__ = ["Engine", "StepResult", "fit", "FitResult", "set_precision_policy", "save_checkpoint",
           "restore_checkpoint"]



def set_precision_policy(mode: str) -> None:
    """Set Keras' global mixed-precision policy for ``fp32`` / ``fp16`` / ``bf16`` (call it
    before building the model)."""
    policy = {"fp32": "float32", "fp16": "mixed_float16", "bf16": "mixed_bfloat16"}[mode]
    tf.keras.mixed_precision.set_global_policy(policy)


def rng_generators(model) -> list:
    """The ``tf.random.Generator`` of every layer of ``model`` that draws random numbers
    (dropout), in a fixed order."""
    gens = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        g = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if g is not None:
            gens.append(g)
    return gens


class Engine(BackgroundSaves):
    """Distributed custom-loop training of one Keras model (see the module docstring).

    Args:
        model: a built Keras model (its variables are broadcast from rank 0).
        optimizer: a tf-keras optimizer (not wrapped in hvd.DistributedOptimizer).
        loss_fn: ``loss_fn(model, batch) -> scalar mean loss`` of one micro-batch.
        schedule, backward_passes_per_step, compression, gradient_predivide_factor,
        precision, max_grad_norm: as in ``hvd_bert.pt.engine.Engine``.
        jit_compile: compile the micro-batch step with XLA.
        resume_resized: accept a checkpoint written by another number of ranks.
        zero_stage: 0, or 1 / 2 (:mod:`hvd_bert.tf.zero`: the optimizer state, and at 2 the
            gradients, split over the ranks; the step runs eagerly). ``zero_bucket_mb`` is
            PyTorch's (TensorFlow reduces and gathers the whole shard at once).
    """

    def __init__(self, model: tf.keras.Model, optimizer, loss_fn: Callable[[tf.keras.Model, Any], tf.Tensor],
                 *, schedule: Schedule, backward_passes_per_step: int = 1, compression: str = "none",
                 gradient_predivide_factor: float = 1.0, precision: str | PrecisionConfig = "fp32",
                 max_grad_norm: float | None = None, jit_compile: bool = False, resume_resized: bool = False,
                 sync: bool = True, zero_stage: int = 0, zero_bucket_mb: float = 32.0):
        init_horovod()  # the one path (hvd_bert.cluster.horovod.init_horovod); once per process
        pcfg = check_engine_args(backward_passes_per_step, compression, precision)
        if pcfg.weights == "bf16":
            raise ConfigError("train.precision.weights=bf16 is PyTorch's (Keras keeps its variables in fp32 "
                              "under the mixed_bfloat16 policy): set train.precision.weights=fp32")
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.schedule, self.k, self.precision = schedule, backward_passes_per_step, pcfg
        self.max_grad_norm = max_grad_norm
        self.compression = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        self.predivide = float(gradient_predivide_factor)
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.data_rank, self.data_size = self.rank, self.world_size  # (the data this rank reads)
        self.tp_size = 1  # (no tensor parallelism in TensorFlow)
        self.stop_signal = STOP  # (the process's one request: a signal during start-up counts)
        self.last_metrics: dict = {}
        self.plan, self.config = None, None  # (from_config sets both)
        self.resume_resized = resume_resized
        self.target_global_batch = None  # set by an elastic run (train.elastic)
        self.total_steps = self.resumed_meta = self.resumed_path = None  # (fit and resume set them)
        # a resume under a new layout keeps its checkpoint's global batch (train.engine.kept_global_batch);
        # a job whose horizon is counted in epochs of its configured batch turns it off
        self.keep_checkpoint_batch = True
        self.jit_compile = jit_compile
        self.step_count = 0
        self.micro_step = 0
        self.skipped_steps = 0
        self.variables = list(model.trainable_variables)
        if not self.variables:
            raise ValueError("the model has no trainable variables: build it (call it on a batch) first")
        self.zero, self._zero_commit = None, None  # (ZeRO's last elastic commit: its shard and a neighbour's)
        if zero_stage:  # (tf.zero: the optimizer gives the hyperparameters; its state lives in shards)
            self.zero = ShardedState(optimizer, self.variables, stage=zero_stage,
                                     compression=self.compression)
        else:  # Create the optimizer state explicitly (no fake step), then broadcast everything.
            optimizer.build(self.variables)
        # (ZeRO stage 2 reduces every micro-batch's gradients into its shard: no accumulators)
        self.accumulators = [] if zero_stage == 2 else [tf.Variable(tf.zeros_like(v), trainable=False)
                                                         for v in self.variables]
        self.loss_scale = tf.Variable(pcfg.init_scale if pcfg.mode == "fp16" else 1.0, dtype=tf.float32,
                                      trainable=False)
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._window_loss = tf.Variable(0.0, dtype=tf.float32, trainable=False)
        self._trace()
        self.checkpoint_format = "consolidated"  # (from_config: train.checkpoint_format)
        self.writer = sharded.writer()  # (sharded checkpoints: the background write in flight)
        if sync:  # (an elastic run syncs inside hvd.elastic.run instead)
            self.broadcast()

    def _trace(self) -> None:
        # reduce_retracing: batches padded to their longest sequence share one traced step.
        # autograph=False: the steps and the models have no Python control flow on tensors, and
        # AutoGraph's rewriting of every function they call cost about 4 s of start-up per rank
        self._micro = tf.function(self._micro_impl, jit_compile=self.jit_compile, reduce_retracing=True,
                                  autograph=False)
        self._apply = tf.function(self._apply_impl, autograph=False)  # (k, world size: constants in it)

    @classmethod
    def from_config(cls, model, cfg: TrainConfig, *, loss_fn, jit_compile: bool = False,
                    sync: bool = True) -> Engine:
        """As PyTorch's ``Engine.from_config(model, cfg, loss_fn=...)``: optimizer, schedule (peak LR
        scaled to the global batch), accumulation, compression, precision and ZeRO from ``cfg``."""
        if cfg.tensor_parallel > 1:
            raise ConfigError("train.tensor_parallel > 1 is PyTorch's (--framework pt); TensorFlow trains "
                              "with train.tensor_parallel=1")
        init_horovod(cfg.horovod)
        plan, peak, kwargs = engine_settings(cfg, hvd.size())
        engine = cls(model, build_optimizer(cfg.optim, lr=peak), loss_fn, jit_compile=jit_compile, sync=sync,
                     **kwargs)
        engine.plan, engine.config = plan, cfg  # (fit writes the config beside its checkpoints)
        engine.checkpoint_format = checkpoint_format(cfg.checkpoint_format, hvd.size(), launched_elastic())
        return engine

    def weights(self) -> list:
        """The model's variables but its dropout generators' states (each rank keeps its own)."""
        rng = {id(g.state) for g in rng_generators(self.model)}
        return [v for v in self.model.variables if id(v) not in rng]

    def broadcast(self) -> None:
        """Every rank takes rank 0's model and optimizer variables (and loss scale); each rank
        keeps its own dropout RNG state (per-rank streams)."""
        hvd.broadcast_variables(self.weights(), root_rank=0)  # Horovod:
        if self.zero is None:  # (ZeRO: each rank's shard is its own; a resume sends it)
            hvd.broadcast_variables(self.optimizer.variables(), root_rank=0)  # Horovod:
        hvd.broadcast_variables([self.loss_scale, self.good_steps], root_rank=0)  # Horovod:

    def memory(self) -> dict:
        """What this rank holds, in bytes, and its peak so far (``train.memory.memory_line``)."""
        def nbytes(variables):
            return sum(int(np.prod(v.shape)) * v.dtype.size for v in variables)
        z = self.zero
        state = z.state_bytes() if z else nbytes(v for v in self.optimizer.variables() if len(v.shape))
        grads = z.part.shard * 4 if z and z.stage == 2 else nbytes(self.accumulators)
        return {"parameters": nbytes(self.model.weights), "gradients": grads, "optimizer_state": state,
                "peak": peak_host_bytes(), "peak_of": "host resident", "zero_stage": z.stage if z else 0,
                "world_size": self.world_size}

    # ------------------------------------------------------------------ elastic (train.elastic)
    def _state_variables(self) -> list:
        return [*self.model.variables, *self.optimizer.variables(), self.loss_scale, self.good_steps]

    def snapshot(self) -> dict:
        """The training state in host memory (what an elastic commit keeps; a collective under
        ZeRO: every rank keeps its shard and its ring neighbour's, so that a lost rank's survives)."""
        if self.zero is not None:
            self._zero_commit = self.zero.commit()
        return {"variables": [v.numpy() for v in self._state_variables()], "zero": self._zero_commit}

    def restore_snapshot(self, snap: dict) -> None:
        """Back to a :meth:`snapshot`, with nothing accumulated. ZeRO: the shards are cut in
        :meth:`sync`, once the new world is known."""
        for v, value in zip(self._state_variables(), snap["variables"]):
            v.assign(value)
        for a in self.accumulators:
            a.assign(tf.zeros_like(a))
        self._window_loss.assign(0.0)
        if self.zero is not None:
            self._zero_commit = snap["zero"]
            self.zero.drop_gradients()

    def sync(self) -> None:
        """Rank 0's variables on every rank (a collective). ZeRO: the state is split over this
        world's ranks, each shard rebuilt from the shards the ranks committed
        (``ShardedState.recover``); the commit then follows the new world (in place: a later
        restore of the same commit finds it)."""
        self.broadcast()
        if self.zero is None:
            return
        self.zero.repartition()
        self._zero_commit = Z.follow(self._zero_commit, self.zero.recover(self._zero_commit))

    def resize(self, plan, schedule) -> None:
        """Take this world's rank and size from Horovod and, given a plan, its layout (the
        step functions are traced again: k and the world size are constants in them)."""
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.data_rank, self.data_size = self.rank, self.world_size
        if plan is not None:
            self.set_plan(plan, schedule)
        else:
            self._trace()

    def set_plan(self, plan, schedule) -> None:
        """A new batch layout on the same ranks (an elastic world's, or a resume's that keeps its
        checkpoint's global batch); the step functions are traced again (k is a constant in them)."""
        self.plan, self.k, self.schedule = plan, plan.backward_passes_per_step, schedule
        self._trace()

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
        if self.zero is not None and self.zero.stage == 2:
            return loss, metrics, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                                   for g, v in zip(grads, self.variables)]
        return loss, metrics, []

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
        return self._after_apply(finite, norm)

    def _after_apply(self, finite, norm):
        """The loss scale's update (fp16), and a new accumulation window."""
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

    def _zero_apply(self, lr: float):
        """The step with the state in shards (tf.zero), eager: the same reduction (stage 1), LR,
        clipping, skips and loss scale as :meth:`_apply_impl`."""
        self.optimizer.learning_rate.assign(lr)  # (what a checkpoint records, as at stage 0)
        grads = None
        if self.zero.stage == 1:
            grads = hvd.grouped_allreduce([a.read_value() for a in self.accumulators], op=hvd.Average,
                                          compression=self.compression)
        finite, norm = self.zero.step(grads, lr=lr, inv_scale=1.0 / float(self.loss_scale.numpy()),
                                      max_grad_norm=self.max_grad_norm)
        return self._after_apply(tf.constant(finite), tf.constant(norm, tf.float32))

    def finish_step(self, result: StepResult, sums: dict) -> tuple[StepResult, dict[str, float]]:
        """The step's result (already on the host here) and the metric sums as floats."""
        return result, {k: float(v) for k, v in sums.items()}

    def finish_steps(self, steps: list) -> list[tuple[StepResult, dict[str, float]]]:
        return [self.finish_step(result, sums) for result, sums in steps]

    def train_micro_batch(self, batch, defer: bool = False) -> StepResult | None:
        """Back-propagate one micro-batch; on the k-th, reduce and apply (returns the result,
        read to the host: ``defer`` changes nothing here). The micro-batch's loss and the
        metrics ``loss_fn`` returned (when it returns ``(loss, metrics)``) are in
        ``last_metrics`` as tensors."""
        loss, metrics, grads = self._micro(batch)
        if grads:
            self.zero.reduce_micro(grads)
        self.last_metrics = {"loss": loss, **metrics}
        sync = is_sync_step(self.micro_step, self.k)
        self.micro_step += 1
        if not sync:
            return None
        lr = float(self.schedule(self.step_count + 1))
        if self.zero is not None:
            finite, norm, scale, _ = self._zero_apply(lr)
        else:
            finite, norm, scale, _ = self._apply(tf.constant(lr, tf.float32))
        finite = bool(finite)
        if finite:
            self.step_count += 1
        else:
            self.skipped_steps += 1
        return StepResult(self.step_count, lr, not finite, float(norm), float(scale))

    def average(self, value: float, name: str = "metric") -> float:
        """Mean of a scalar over ranks (a collective)."""
        return float(hvd.allreduce(tf.constant([float(value)]), op=hvd.Average, name=name)[0])

    def any_rank(self, flag: bool, name: str) -> bool:
        """True on every rank when ``flag`` is true on any rank (a collective)."""
        t = tf.constant([1.0 if flag else 0.0])
        return bool(hvd.allreduce(t, op=hvd.Max, name=name)[0] > 0)  # Horovod:

    def install_stop_handler(self, signals=STOP_SIGNALS) -> None:
        """On SIGTERM (what SLURM sends before a time limit) or Ctrl-C, finish the current step, save a
        checkpoint and stop: :meth:`should_stop` turns true on every rank together."""
        self.stop_signal.install(signals)

    def should_stop(self) -> bool:
        """Whether any rank received a stop signal (a collective: every rank must call it)."""
        return self.any_rank(self.stop_signal.requested, "hvd_bert.stop")

    # ------------------------------------------------------------------ checkpoints
    def _rng_state(self) -> dict:
        return {"tf": [g.state.numpy().tolist() for g in rng_generators(self.model)], **host_rng_state()}

    def _set_rng_state(self, state: dict) -> None:
        gens = rng_generators(self.model)
        if len(gens) == len(state["tf"]):
            for g, s in zip(gens, state["tf"]):
                g.state.assign(np.array(s, dtype=g.state.dtype.as_numpy_dtype))
        set_host_rng_state(state)

    def save(self, folder: str | Path, data_state: Any = None, keep: int = 3) -> Path | None:
        """Atomic rank-0 checkpoint ``folder/ckpt-<step>.tf/`` with the metadata of
        ``train.engine.checkpoint_meta`` (every rank's RNG included) in ``meta.json``
        (a collective)."""
        rng = hvd.allgather_object(self._rng_state(), name="hvd_bert.rng")  # Horovod:
        if self.checkpoint_format == "sharded":  # every rank its share, written in the background
            return SS.save(sharded.declare(self), self.writer, folder, self.step_count,
                           checkpoint_meta(self, data_state, rng), keep,
                           lambda: hvd.allreduce(tf.constant(0.0), name="hvd_bert.barrier.shards"))
        trackables = self._trackables()
        if self.zero is not None:  # stage 0's format: rank 0 gathers the shards into a fresh optimizer
            trackables["optimizer"] = self.zero.consolidated_optimizer()
        path = None
        if self.rank == 0:
            path = save_checkpoint(folder, self.step_count, trackables, keep,
                                   meta=checkpoint_meta(self, data_state, rng))
        # Horovod: a barrier (TF has none): nobody goes on before rank 0 has written.
        hvd.allreduce(tf.constant(0.0), name="hvd_bert.barrier.save")
        return path

    def resume(self, folder: str | Path | None) -> Any:
        """Restore the newest checkpoint on rank 0 and broadcast it (a collective); an
        unreadable checkpoint raises on every rank."""
        restored = {}

        def read_meta(path):
            if S.is_sharded(path):  # (every rank reads its share below)
                return S.Reader(path).meta
            return read_checkpoint_meta(path)

        def load(path):
            if S.is_sharded(path):
                return
            trackables = self._trackables()
            if self.zero is not None:  # (rank 0 holds the whole state until the shards are sent)
                trackables["optimizer"] = restored["optimizer"] = self.zero.fresh_optimizer()
            restore_checkpoint(path, trackables)

        meta = resume_on_rank0(self, folder, (CKPT_SUFFIX, S.SUFFIX), read_meta=read_meta, load=load,
                               broadcast_object=lambda o, n: hvd.broadcast_object(o, root_rank=0, name=n),
                               allow_resized=self.resume_resized)
        if meta is None:
            return None
        if S.is_sharded(self.resumed_path):
            SS.load(sharded.declare(self), self.resumed_path,  # every rank reads its own share
                    lambda obj, name: hvd.allgather_object(obj, name=name))  # Horovod:
        else:
            self.broadcast()
            if self.zero is not None:
                self.zero.load_sharded(restored.pop("optimizer", None))
        restore_rng(self, meta, self._set_rng_state)
        refuse_nonfinite(self, self._nonfinite())
        return meta["data"]

    def _nonfinite(self) -> list[str]:
        """The names of this rank's weights and optimizer state holding NaN or infinite values,
        and the loss scale's when it is not a positive number (a resumed state's check)."""
        state = [*self.model.variables, *self.optimizer.variables()]
        if self.zero is not None:
            state += list(self.zero.state.values())
        bad = [v.name for v in state if v.dtype.is_floating and not bool(tf.reduce_all(tf.math.is_finite(v)))]
        scale = float(self.loss_scale.numpy())
        return bad + ([] if np.isfinite(scale) and scale > 0 else [f"the loss scale {scale}"])

    def _trackables(self) -> dict:
        return dict(model=self.model, optimizer=self.optimizer, loss_scale=self.loss_scale,
                    good_steps=self.good_steps)
