"""Horovod integration for PyTorch, in one place a training script calls.

    engine = Engine.from_config(model, cfg)            # wraps, broadcasts, sets up AMP
    for batch in batches:
        with engine.autocast():
            loss = compute_loss(model, batch)
        if engine.backward(loss):                      # True on the k-th micro-batch
            result = engine.step()                     # allreduce, unscale, step, schedule

What it does, in Horovod's order:
  * ``hvd.DistributedOptimizer`` with ``named_parameters``, compression (none / fp16),
    ``backward_passes_per_step=k`` and ``gradient_predivide_factor``. Horovod sums the k
    micro-batch gradients; :meth:`Engine.backward` divides the loss by k, so k micro-batches of
    b equal one batch of k*b and a user cannot forget it.
  * Parameters and optimizer state are broadcast from rank 0 at start and after resume, the
    optimizer state created explicitly first (Horovod would take a fake step).
  * Mixed precision: ``torch.autocast`` (bf16 or fp16) and, for fp16, a ``GradScaler``:
    synchronize, unscale, global norm (NVLAMB/clipping), step under ``skip_synchronize()``,
    scaler update. The gradients are checked for inf/NaN after the allreduce, so every rank
    sees the same buffer and makes the same decision: an overflow on any rank skips the step
    on every rank, and a skipped step does not advance the LR schedule.
  * The LR of every group is set from the schedule on every optimizer step.
  * ``train.precision.weights=bf16``: bf16 weights and gradients over fp32 masters that live with
    the optimizer state (:mod:`hvd_bert.pt.zero`, split with it under ZeRO); checkpoints hold the
    masters as fp32 weights (:meth:`Engine.model_state`).
  * Rank-0 atomic checkpoints of model, optimizer, scaler, step, data position and every
    rank's RNG state; resume broadcasts them so the run continues the same trajectory.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import torch
import horovod.torch as hvd

from hvd_bert.core import zero as Z
from hvd_bert.core.batch import is_sync_step
from hvd_bert.config import ConfigError, PrecisionConfig, TrainConfig
from hvd_bert.train.engine import FitResult, StepResult, check_engine_args, engine_settings
from hvd_bert.train.memory import peak_host_bytes
from hvd_bert.train.elastic import launched_elastic
from hvd_bert.train.checkpoint import checkpoint_format
from hvd_bert.train.loop import fit
from hvd_bert.stop import STOP, STOP_SIGNALS
from hvd_bert.core.schedules import Schedule
from hvd_bert.pt import init_horovod
from hvd_bert.pt.checkpoint import load_checkpoint_file, to_cpu
from hvd_bert.pt.engine_checkpoints import Checkpoints
from hvd_bert.pt.optim import build_optimizer, init_state
from hvd_bert.pt.step import DeviceStep, plain_step
from hvd_bert.pt import sharded
from hvd_bert.pt import tensor_parallel as TP
from hvd_bert.pt.zero import Fp32Wire, ShardedOptimizer, loss_scale, state_bytes, update_loss_scale

__all__ = ["Engine", "StepResult", "fit", "FitResult", "load_checkpoint_file"]


def autocast(mode: str, device_type: str = "cpu"):
    """``torch.autocast`` for ``bf16`` / ``fp16``; a no-op context for ``fp32``."""
    if mode == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.float16 if mode == "fp16" else torch.bfloat16)


class Engine(Checkpoints):
    """Distributed training state for one model and optimizer (see the module docstring).

    Args:
        model: the model; its parameters are broadcast from rank 0.
        optimizer: a plain torch optimizer over ``model``'s parameters.
        schedule: ``step -> lr`` (``hvd_bert.core.schedules``), called with the 1-based
            step number of each update.
        backward_passes_per_step: micro-batches per optimizer step (k).
        compression: ``"none"`` or ``"fp16"`` allreduce wire format.
        gradient_predivide_factor: Horovod's pre/post division split of the average.
        precision: ``"fp32"``, ``"bf16"``, ``"fp16"`` or a :class:`PrecisionConfig`.
        max_grad_norm: clip the global gradient norm (after unscaling); ``None``: no clipping.
            NVLAMB clips inside the optimizer; do not set both.
        device: the device of the model (default: CUDA device ``local_rank`` if available).
        loss_fn: ``loss_fn(model, batch) -> loss`` or ``(loss, {name: tensor})``, the mean over
            one micro-batch; needed by :meth:`train_micro_batch` (and so by ``fit``).
        resume_resized: accept a checkpoint written by another number of ranks.
        zero_stage: 0 (Horovod's DistributedOptimizer), 1 or 2 (:mod:`hvd_bert.pt.zero`: the
            optimizer state, and at 2 the gradients, split over the ranks).
        zero_bucket_mb: MiB per reduce-scatter/allgather call of a ZeRO step.
        tp_groups: the tensor-parallel groups of a model already split
            (:func:`hvd_bert.pt.tensor_parallel.setup`; ``from_config`` does both).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 schedule: Schedule, backward_passes_per_step: int = 1, compression: str = "none",
                 gradient_predivide_factor: float = 1.0,
                 precision: str | PrecisionConfig = "fp32", max_grad_norm: float | None = None,
                 device: torch.device | str | None = None,
                 loss_fn: Callable[[torch.nn.Module, Any], Any] | None = None, resume_resized: bool = False,
                 sync: bool = True, zero_stage: int = 0, zero_bucket_mb: float = 32.0, tp_groups=None):
        init_horovod()  # the one path (hvd_bert.cluster.horovod.init_horovod); once per process
        pcfg = check_engine_args(backward_passes_per_step, compression, precision)
        self.model = model
        self.schedule = schedule
        self.k = backward_passes_per_step
        self.precision = pcfg
        self.max_grad_norm = max_grad_norm
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.step_count = 0      # optimizer steps applied (the schedule's t after the step)
        self.micro_step = self.skipped_steps = 0  # micro-batches back-propagated over the run; skipped steps
        self.unread = 0          # steps decided on the device and not read yet (finish_steps)
        self.loss_fn, self.resume_resized = loss_fn, resume_resized
        self.plan = self.config = None  # (from_config sets both)
        self.target_global_batch = None  # set by an elastic run (train.elastic)
        self.total_steps = self.resumed_meta = self.resumed_path = None  # (fit and resume set them)
        # a resume under a new layout keeps its checkpoint's global batch (train.engine.kept_global_batch);
        # a job whose horizon is counted in epochs of its configured batch turns it off
        self.keep_checkpoint_batch = True
        self.last_metrics: dict = {}

        self.zero, self.tp, self.tp_size = None, tp_groups, tp_groups.size if tp_groups else 1
        self._zero_commit = None  # ZeRO under elastic: the last commit's shards (own and a neighbour's)
        # the data this rank reads: its data-parallel replica's (a tensor-parallel group reads one)
        self.data_rank, self.data_size = (tp_groups.dp_rank, tp_groups.dp_size) if tp_groups else \
            (self.rank, self.world_size)
        if tp_groups and launched_elastic():
            raise ConfigError("train.tensor_parallel > 1 does not run under Horovod elastic yet (a lost "
                              "worker breaks its group's layers): set it to 1, or launch without "
                              "--min-np/--max-np")
        dp_set = tp_groups.dp_set if tp_groups else hvd.global_process_set
        masters = pcfg.weights == "bf16"  # (the parameters cast before Horovod hooks their gradients)
        fp32 = self._to_bf16(optimizer, sync) if masters else None
        if zero_stage == 2:
            # ZeRO stage 2: the gradients are reduce-scattered by pt.zero, not by Horovod's hooks
            self.optimizer = optimizer
        else:
            # Horovod: DistributedOptimizer builds a new optimizer of a subclass of
            # type(optimizer) from optimizer.param_groups; from here on use self.optimizer only.
            # (ZeRO stage 1 keeps its allreduce, overlapped with the backward pass and fused.)
            self.optimizer = hvd.DistributedOptimizer(
                optimizer, named_parameters=model.named_parameters(),
                compression=hvd.Compression.fp16 if compression == "fp16" else Fp32Wire if masters
                else hvd.Compression.none,
                backward_passes_per_step=self.k, op=hvd.Average,
                gradient_predivide_factor=gradient_predivide_factor, process_set=dp_set)
        if zero_stage or tp_groups or masters:  # the optimizer keeps the hyperparameters; its state: shards
            self.zero = ShardedOptimizer(
                self.optimizer, stage=zero_stage, compression=compression, bucket_mb=zero_bucket_mb,
                process_set=dp_set, norm_set=hvd.global_process_set if tp_groups else None,
                norm_weights=TP.norm_weights(self.param_names(), tp_groups, zero_stage > 0) if tp_groups
                else None, masters=masters)
            if masters:
                self.zero.hold_masters(fp32)
        else:
            # Create the optimizer state before the broadcast: Horovod would otherwise create it
            # by taking a step with zero gradients (shifting LAMB's bias correction, one decay).
            init_state(self.optimizer)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=pcfg.mode == "fp16", init_scale=pcfg.init_scale,
            growth_factor=pcfg.growth_factor, backoff_factor=pcfg.backoff_factor,
            growth_interval=pcfg.growth_interval)
        if sync and not masters:  # (an elastic run syncs inside hvd.elastic.run instead)
            self.broadcast()
        self.stop_signal = STOP  # (the process's one request: a signal during start-up counts)
        self.checkpoint_format = "consolidated"  # (from_config: train.checkpoint_format)
        self.writer = sharded.writer()  # (sharded checkpoints: the background write in flight)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, model: torch.nn.Module, cfg: TrainConfig,
                    device: torch.device | str | None = None,
                    loss_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
                    sync: bool = True) -> Engine:
        """Optimizer, schedule (peak LR scaled to the global batch), accumulation, compression
        and precision from one :class:`TrainConfig`; with ``train.tensor_parallel`` > 1 the
        model's layers are split over the groups first."""
        tp = cfg.tensor_parallel
        init_horovod(cfg.horovod, process_sets=tp > 1)
        groups = TP.setup(model, tp) if tp > 1 else None
        plan, peak, kwargs = engine_settings(cfg, hvd.size() // tp)
        opt = build_optimizer(model.named_parameters(), cfg.optim, lr=peak)
        engine = cls(model, opt, device=device, loss_fn=loss_fn, sync=sync, tp_groups=groups, **kwargs)
        engine.plan, engine.config = plan, cfg  # (fit writes the config beside its checkpoints)
        engine.checkpoint_format = checkpoint_format(cfg.checkpoint_format, hvd.size(), launched_elastic())
        return engine

    def param_names(self) -> list[str]:
        """The parameters' names in the optimizer's order (what its state is indexed by)."""
        return [n for g in self.optimizer.param_groups for n in g["names"]]

    def _to_bf16(self, optimizer: torch.optim.Optimizer, sync: bool) -> list[torch.Tensor]:
        """bf16 weights (``train.precision.weights``): the model broadcast in fp32 (Horovod 0.28.1
        refuses bfloat16), then the optimizer's parameters cast; returns their fp32 values."""
        if launched_elastic() or self.tp is not None:  # (the config refuses tensor parallelism first)
            raise ConfigError("train.precision.weights=bf16 does not run under Horovod elastic or "
                              "train.tensor_parallel > 1 yet: set train.precision.weights=fp32, or launch "
                              "without --min-np/--max-np")
        if sync:
            hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)  # Horovod:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        fp32 = [p.detach().clone() for p in params]
        for p in params:
            p.data = p.data.to(torch.bfloat16)
        return fp32

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's ``state_dict`` as a checkpoint holds it: with bf16 weights, the whole fp32
        masters in place of the parameters (a collective: ZeRO's allgather of the masters)."""
        state = self.model.state_dict()
        if self.zero is None or self.zero.master is None:
            return state
        names = {id(p): n for n, p in self.model.named_parameters()}
        return {**state, **{names[id(p)]: t for p, t in zip(self.zero.params, self.zero.full_masters())}}

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """A checkpoint's model state (whole, on this rank): with bf16 weights, the masters take the
        fp32 values and the parameters their bf16 rounding."""
        self.model.load_state_dict(state)
        if self.zero is not None and self.zero.master is not None:
            names = {id(p): n for n, p in self.model.named_parameters()}
            self.zero.load_masters([state[names[id(p)]].to(self.device) for p in self.zero.params])

    def broadcast(self) -> None:
        """Make every rank hold rank 0's parameters and optimizer state (tensor parallelism: its
        data-parallel group's first member's share)."""
        if self.tp is not None:
            TP.broadcast_in_group(list(self.model.state_dict().values()), self.tp)
            return
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)  # Horovod:
        if self.zero is None:  # (ZeRO: each rank's shard is its own; resume sends it)
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)  # Horovod:

    def memory(self) -> dict:
        """What this rank holds, in bytes, and its peak so far (``train.memory.memory_line``)."""
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        grads = params if self.zero is None or self.zero.stage < 2 else self.zero.part.shard * 4
        cuda = self.device.type == "cuda"
        return {"parameters": params, "gradients": grads, "optimizer_state": self.optimizer_state_bytes(),
                "peak": torch.cuda.max_memory_allocated(self.device) if cuda else peak_host_bytes(),
                "peak_of": "CUDA allocations" if cuda else "host resident",
                "zero_stage": self.zero.stage if self.zero is not None else 0, "world_size": self.data_size,
                "elastic_commit": self.zero.commit_bytes(self._zero_commit) if self._zero_commit else None,
                "tensor_parallel": self.tp.size if self.tp is not None else 1}

    def optimizer_state_bytes(self) -> int:
        """The bytes of this rank's optimizer state (ZeRO: its shard)."""
        return self.zero.state_bytes() if self.zero is not None else state_bytes(self.optimizer)

    # ------------------------------------------------------------------ elastic (train.elastic)
    def snapshot(self) -> dict:
        """The training state in host memory (what an elastic commit keeps; a collective under
        ZeRO: every rank keeps its shard and its ring neighbour's, so that a lost rank's survives)."""
        if self.zero is not None:
            optimizer = self._zero_commit = self.zero.commit()
        else:
            optimizer = to_cpu(self.optimizer.state_dict())
        return {"model": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
                "optimizer": optimizer, "scaler": self.scaler.state_dict()}

    def restore_snapshot(self, snap: dict) -> None:
        """Back to a :meth:`snapshot`, with no gradients pending (Horovod's load_state_dict
        drops the handles of an allreduce that failed). ZeRO: the shards are cut in
        :meth:`sync`, once the new world is known."""
        self.model.load_state_dict(snap["model"])
        if self.zero is not None:
            self._zero_commit = snap["optimizer"]
            self.zero.drop_gradients()
            if self.zero.stage < 2:  # (Horovod's optimizer: its handles dropped; it holds no state)
                self.optimizer.load_state_dict(self.optimizer.state_dict())
        else:
            self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))  # (it may alias tensors)
        self.scaler.load_state_dict(snap["scaler"])
        for p in self._params():
            p.grad = None

    def sync(self) -> None:
        """Rank 0's parameters, optimizer state and loss scale on every rank (a collective).
        ZeRO: the state is split over this world's ranks, each shard rebuilt from the shards the
        ranks committed (``ShardedOptimizer.recover``); the commit then follows the new world (in
        place: a later restore of the same commit finds it)."""
        self.broadcast()
        if self.zero is not None:
            self.zero.repartition()
            self._zero_commit = Z.follow(self._zero_commit, self.zero.recover(self._zero_commit))
        self.scaler.load_state_dict(hvd.broadcast_object(self.scaler.state_dict(), root_rank=0,
                                                         name="hvd_bert.elastic.scaler"))

    def resize(self, plan, schedule) -> None:
        """Take this world's rank and size from Horovod and, given a plan, its layout: k is
        Horovod's ``backward_passes_per_step`` from here on, and the LR comes from ``schedule``."""
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.data_rank, self.data_size = self.rank, self.world_size  # (no tensor parallelism here)
        if plan is not None:
            self.set_plan(plan, schedule)

    def set_plan(self, plan, schedule) -> None:
        """A new batch layout on the same ranks (an elastic world's, or a resume's that keeps its
        checkpoint's global batch): k is Horovod's ``backward_passes_per_step`` from here on, and
        the LR comes from ``schedule``."""
        self.plan, self.k, self.schedule = plan, plan.backward_passes_per_step, schedule
        if self.zero is None or self.zero.stage < 2:
            self.optimizer.set_backward_passes_per_step(self.k)  # Horovod:

    # ------------------------------------------------------------------ the step
    def autocast(self):
        """The forward pass's autocast context (a no-op in fp32)."""
        return autocast(self.precision.mode, self.device.type)

    def train_micro_batch(self, batch: Any, defer: bool = False):
        """Forward (under autocast) and backward of one micro-batch with ``loss_fn``; on the
        k-th, :meth:`step`. The loss and metrics are in ``last_metrics`` (detached tensors).
        ``defer`` (the loop's): the step's result stays on the device until :meth:`finish_step`."""
        with self.autocast():
            out = self.loss_fn(self.model, batch)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        self.last_metrics = {"loss": loss.detach().float(), **{k: v.detach() for k, v in metrics.items()}}
        if not self.backward(loss):
            return None
        return self.step_on_device() if defer else self.step()

    def backward(self, loss: torch.Tensor) -> bool:
        """Back-propagate one micro-batch. Returns True when this micro-batch completes an
        accumulation window: call :meth:`step` then."""
        # Horovod sums the k micro-batch gradients; dividing by k makes them their mean.
        self.scaler.scale(loss / self.k).backward()
        sync = is_sync_step(self.micro_step, self.k)
        self.micro_step += 1
        if self.zero is not None and self.zero.stage == 2:
            self.zero.finish_backward()  # (its hooks reduced the gradients into the shard as they came)
        return sync

    def step(self) -> StepResult:
        """Reduce, check, unscale, clip and apply the accumulated gradients (:meth:`step_on_device`),
        and read the result to the host."""
        return self.finish_step(self.step_on_device(), {})[0]

    def step_on_device(self) -> DeviceStep:
        """Reduce, check, unscale, clip and apply the accumulated gradients with no host read of
        a training value: the global norm, the clip, the decision to skip a non-finite step (a
        gate the update is scaled by, ``optim_parts.coef``), the update and the loss scale stay
        on the device. :meth:`finish_step` reads the outcome (once) and counts the step. On a CPU
        the fused C kernels of a plain step read their coefficients from host memory (where the
        tensors live); ``HVD_BERT_FUSED_OPTIM=0`` gives the device's path there too."""
        if self.micro_step == 0 or self.micro_step % self.k:
            raise RuntimeError(
                f"step() called after {self.micro_step % self.k} of {self.k} micro-batches of the "
                f"current accumulation window; call it when backward() returns True")
        # the step this one is, as the host knows it: exact when every earlier step was read
        # (train.host_reads=step); otherwise counting the unread ones as applied
        t = self.step_count + self.unread + 1
        lr = float(self.schedule(t))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        scale = loss_scale(self.scaler)
        inv_scale = 1.0 / scale.double() if scale is not None else 1.0
        if self.zero is not None:
            if self.zero.stage < 2:
                self.optimizer.synchronize()  # Horovod: every allreduce done; every rank the same .grad
            gate, grad_norm = self.zero.step(inv_scale=inv_scale, max_grad_norm=self.max_grad_norm)
        else:
            # Horovod: wait for every allreduce; from here on all ranks hold the same gradients.
            self.optimizer.synchronize()
            gate, grad_norm = plain_step(self.optimizer, inv_scale, self.max_grad_norm, t)
        if self.zero is None or self.zero.stage < 2:
            self.optimizer.zero_grad()  # Horovod's zero_grad takes no set_to_none (torch default: True)
        if scale is not None:
            update_loss_scale(self.scaler, gate)
        self.unread += 1
        return DeviceStep(lr, gate, grad_norm, scale.clone() if scale is not None else None)

    def finish_step(self, result: DeviceStep | StepResult, sums: dict) -> tuple[StepResult, dict]:
        """A step's outcome and this rank's metric sums (``{name: tensor}``) read to the host in
        one transfer; the step counted (applied or skipped)."""
        return self.finish_steps([(result, sums)])[0]

    def finish_steps(self, steps: list) -> list[tuple[StepResult, dict]]:
        """:meth:`finish_step` of several steps, in order, in one transfer."""
        values = []
        for result, sums in steps:
            scale = result.scale if result.scale is not None else result.gate
            values += [result.gate, result.grad_norm, scale, *sums.values()]
        if not values:
            return []
        host = torch.stack([torch.as_tensor(v, device=self.device).double().reshape(()) for v in values])
        flat, out = host.tolist(), []  # the one host read
        for result, sums in steps:
            (applied, grad_norm, scale, *means), flat = flat[:3 + len(sums)], flat[3 + len(sums):]
            self.unread -= 1
            if applied:
                self.step_count += 1
            else:
                self.skipped_steps += 1
                if self.zero is not None:
                    self.zero.skipped()
            out.append((StepResult(self.step_count, result.lr, not applied,
                                   grad_norm if applied else float("inf"),
                                   scale if result.scale is not None else 1.0), dict(zip(sums, means))))
        return out

    def _params(self) -> Iterator[torch.nn.Parameter]:
        return (p for g in self.optimizer.param_groups for p in g["params"])

    # ------------------------------------------------------------------ cross-rank helpers
    def average(self, value: float, name: str = "metric") -> float:
        """The mean of a scalar over ranks (a collective: every rank must call it)."""
        return float(hvd.allreduce(torch.tensor([float(value)]), op=hvd.Average, name=name).item())

    def any_rank(self, flag: bool, name: str) -> bool:
        """True on every rank when ``flag`` is true on any rank (a collective)."""
        return bool(hvd.allreduce(torch.tensor([float(bool(flag))]), op=hvd.Max, name=name).item() > 0)

    def install_stop_handler(self, signals=STOP_SIGNALS) -> None:
        """On SIGTERM (what SLURM sends before a time limit) or Ctrl-C, finish the current step, save a
        checkpoint and stop: :meth:`should_stop` turns true on every rank together."""
        self.stop_signal.install(signals)

    def should_stop(self) -> bool:
        """Whether any rank received a stop signal (a collective: every rank must call it)."""
        return self.any_rank(self.stop_signal.requested, "hvd_bert.stop")
