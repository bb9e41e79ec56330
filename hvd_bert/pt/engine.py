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
  * Rank-0 atomic checkpoints of model, optimizer, scaler, step, data position and every
    rank's RNG state; resume broadcasts them so the run continues the same trajectory.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import horovod.torch as hvd

from hvd_bert.cluster import check_launch, check_world
from hvd_bert.common.batch import BatchPlan, is_sync_step
from hvd_bert.common.checkpoint import atomic_write, checkpoint_path, latest_checkpoint, prune
from hvd_bert.common.config import PrecisionConfig, TrainConfig, make_schedule
from hvd_bert.common.runlog import MetricWindow, RunLog, StepBook, StopSignal
from hvd_bert.common.schedules import Schedule
from hvd_bert.pt.optim import build_optimizer, init_state

__all__ = ["Engine", "StepResult", "fit", "FitResult"]

CKPT_SUFFIX = "pt"


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did (identical on every rank)."""

    step: int            # optimizer steps applied so far
    lr: float            # the LR used (or that would have been used, when skipped)
    skipped: bool        # inf/NaN in the reduced gradients: no update, schedule not advanced
    grad_norm: float     # global norm of the reduced, unscaled gradients
    loss_scale: float    # the loss scale after this step (1.0 without fp16)


def _ensure_init() -> None:
    if not hvd.is_initialized():
        check_launch()  # plain `srun` without --mpi=pmix: say so before MPI aborts
        hvd.init()  # Horovod:
        check_world(hvd.size())


class Engine:
    """Distributed training state for one model and optimizer (see the module docstring).

    Args:
        model: the model; its parameters are broadcast from rank 0.
        optimizer: a plain torch optimizer over ``model``'s parameters.
        schedule: ``step -> lr`` (``hvd_bert.common.schedules``), called with the 1-based
            step number of each update.
        backward_passes_per_step: micro-batches per optimizer step (k).
        compression: ``"none"`` or ``"fp16"`` allreduce wire format.
        gradient_predivide_factor: Horovod's pre/post division split of the average.
        precision: ``"fp32"``, ``"bf16"``, ``"fp16"`` or a :class:`PrecisionConfig`.
        max_grad_norm: clip the global gradient norm (after unscaling); ``None``: no clipping.
            NVLAMB clips inside the optimizer; do not set both.
        device: the device of the model (default: CUDA device ``local_rank`` if available).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 schedule: Schedule, backward_passes_per_step: int = 1, compression: str = "none",
                 gradient_predivide_factor: float = 1.0,
                 precision: str | PrecisionConfig = "fp32", max_grad_norm: float | None = None,
                 device: torch.device | str | None = None):
        _ensure_init()
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        if compression not in ("none", "fp16"):
            raise ValueError(f"compression must be 'none' or 'fp16', got {compression!r}")
        pcfg = precision if isinstance(precision, PrecisionConfig) else PrecisionConfig(mode=precision)
        self.model = model
        self.schedule = schedule
        self.k = backward_passes_per_step
        self.precision = pcfg
        self.max_grad_norm = max_grad_norm
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.step_count = 0      # optimizer steps applied (the schedule's t after the step)
        self.micro_step = 0      # micro-batches back-propagated over the whole run
        self.skipped_steps = 0

        # Horovod: DistributedOptimizer builds a new optimizer of a subclass of
        # type(optimizer) from optimizer.param_groups; from here on use self.optimizer only.
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
            backward_passes_per_step=self.k, op=hvd.Average,
            gradient_predivide_factor=gradient_predivide_factor)
        # Create the optimizer state before the broadcast: Horovod would otherwise create it
        # by taking a step with zero gradients (shifting LAMB's bias correction, one decay).
        init_state(self.optimizer)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=pcfg.mode == "fp16", init_scale=pcfg.init_scale,
            growth_factor=pcfg.growth_factor, backoff_factor=pcfg.backoff_factor,
            growth_interval=pcfg.growth_interval)
        self.broadcast()
        self.stop_signal = StopSignal()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, model: torch.nn.Module, cfg: TrainConfig,
                    device: torch.device | str | None = None) -> Engine:
        """Optimizer, schedule (peak LR scaled to the global batch), accumulation, compression
        and precision from one :class:`TrainConfig`."""
        _ensure_init()
        plan = cfg.batch.plan(hvd.size())
        peak = cfg.optim.peak_lr(plan.global_batch_size)
        opt = build_optimizer(model.named_parameters(), cfg.optim, lr=peak)
        clip = None if cfg.optim.name == "nvlamb" else cfg.optim.max_grad_norm
        engine = cls(model, opt, schedule=make_schedule(cfg.schedule, peak),
                     backward_passes_per_step=plan.backward_passes_per_step,
                     compression=cfg.horovod.compression,
                     gradient_predivide_factor=cfg.horovod.gradient_predivide_factor,
                     precision=cfg.precision, max_grad_norm=clip, device=device)
        engine.plan = plan
        return engine

    def broadcast(self) -> None:
        """Make every rank hold rank 0's parameters and optimizer state."""
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)  # Horovod:
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)  # Horovod:

    # ------------------------------------------------------------------ the step
    def autocast(self):
        """The forward pass's autocast context (a no-op in fp32)."""
        if self.precision.mode == "fp32":
            return contextlib.nullcontext()
        dtype = torch.float16 if self.precision.mode == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> bool:
        """Back-propagate one micro-batch. Returns True when this micro-batch completes an
        accumulation window: call :meth:`step` then."""
        # Horovod sums the k micro-batch gradients; dividing by k makes them their mean.
        self.scaler.scale(loss / self.k).backward()
        sync = is_sync_step(self.micro_step, self.k)
        self.micro_step += 1
        return sync

    def step(self) -> StepResult:
        """Reduce, check, unscale, clip and apply the accumulated gradients."""
        if self.micro_step == 0 or self.micro_step % self.k:
            raise RuntimeError(
                f"step() called after {self.micro_step % self.k} of {self.k} micro-batches of the "
                f"current accumulation window; call it when backward() returns True")
        # Horovod: wait for every allreduce; from here on all ranks hold the same gradients.
        self.optimizer.synchronize()
        # Unscale after the synchronize, so every rank unscales (and checks) the same buffer.
        self.scaler.unscale_(self.optimizer)
        grad_norm = self._global_grad_norm()
        finite = math.isfinite(grad_norm)
        if finite and self.max_grad_norm is not None and grad_norm > self.max_grad_norm:
            grads = [p.grad for p in self._params() if p.grad is not None]
            torch._foreach_mul_(grads, self.max_grad_norm / grad_norm)
        lr = float(self.schedule(self.step_count + 1))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with self.optimizer.skip_synchronize():
            if self.scaler.is_enabled():
                self.scaler.step(self.optimizer)  # skips by itself on inf/NaN
            elif finite:
                self.optimizer.step()
        self.scaler.update()
        if finite:
            self.step_count += 1
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad()  # Horovod's zero_grad takes no set_to_none (torch default: True)
        scale = float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0
        return StepResult(self.step_count, lr, not finite, grad_norm, scale)

    def _params(self) -> Iterator[torch.nn.Parameter]:
        for g in self.optimizer.param_groups:
            yield from g["params"]

    def _global_grad_norm(self) -> float:
        grads = [p.grad for p in self._params() if p.grad is not None]
        if not grads:
            return 0.0
        norms = torch._foreach_norm(grads)
        return float(torch.linalg.vector_norm(torch.stack([n.float() for n in norms])))

    # ------------------------------------------------------------------ cross-rank helpers
    def average(self, value: float, name: str = "metric") -> float:
        """The mean of a scalar over ranks (a collective: every rank must call it)."""
        return float(hvd.allreduce(torch.tensor([float(value)]), op=hvd.Average, name=name).item())

    def install_stop_handler(self, signals=(signal.SIGTERM, signal.SIGUSR1)) -> None:
        """On SIGTERM (what SLURM sends before a time limit), finish the current step, save a
        checkpoint and stop: :meth:`should_stop` turns true on every rank together."""
        self.stop_signal.install(signals)

    def should_stop(self) -> bool:
        """Whether any rank received a stop signal (a collective: every rank must call it)."""
        flag = torch.tensor([1.0 if self.stop_signal.requested else 0.0])
        return bool(hvd.allreduce(flag, op=hvd.Max, name="hvd_bert.stop").item() > 0)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, data_state: Any = None) -> dict:
        """This rank's view of the training state; the RNG states of all ranks are gathered
        (a collective: every rank must call it)."""
        rng = hvd.allgather_object(_rng_state(), name="hvd_bert.rng")  # Horovod:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(), "step": self.step_count,
                "micro_step": self.micro_step, "skipped_steps": self.skipped_steps,
                "data": data_state, "rng": rng, "world_size": self.world_size,
                "backward_passes_per_step": self.k}

    def save(self, folder: str | Path, data_state: Any = None, keep: int = 3) -> Path | None:
        """Write ``folder/ckpt-<step>.pt`` atomically from rank 0 and keep the newest
        ``keep`` (a collective: every rank must call it). Returns the path on rank 0."""
        state = self.state_dict(data_state)
        path = None
        if self.rank == 0:
            path = checkpoint_path(folder, self.step_count, CKPT_SUFFIX)
            atomic_write(path, lambda tmp: torch.save(state, tmp))
            prune(folder, CKPT_SUFFIX, keep)
        hvd.barrier()  # Horovod: the file exists before anyone goes on (e.g. to exit)
        return path

    def resume(self, folder_or_file: str | Path | None) -> Any:
        """Load the newest checkpoint in a folder (or a given file) on rank 0 and broadcast it.
        Returns the saved data state, or None when there is no checkpoint (a collective)."""
        path = None
        if self.rank == 0 and folder_or_file is not None:
            p = Path(folder_or_file)
            path = p if p.is_file() else latest_checkpoint(p, CKPT_SUFFIX)
        # Horovod: name every broadcast_object: its default name is the object's type, which
        # differs between rank 0 (a str, a dict) and the others (None), and would hang.
        path = hvd.broadcast_object(str(path) if path else None, root_rank=0,
                                    name="hvd_bert.resume.path")
        if path is None:
            return None
        meta = None
        if self.rank == 0:
            try:
                ckpt = torch.load(path, map_location=self.device, weights_only=False)
            except Exception as e:  # noqa: BLE001  (reported on every rank below)
                meta = {"error": f"cannot read checkpoint {path}: {type(e).__name__}: {e}; "
                                 f"delete it to resume from the one before, or start afresh"}
            else:
                self.model.load_state_dict(ckpt["model"])
                self.optimizer.load_state_dict(ckpt["optimizer"])
                meta = {k: ckpt[k] for k in ("scaler", "step", "micro_step", "skipped_steps",
                                             "data", "rng", "world_size")}
        meta = hvd.broadcast_object(meta, root_rank=0, name="hvd_bert.resume.meta")  # Horovod:
        if "error" in meta:
            raise RuntimeError(meta["error"])
        self.broadcast()  # Horovod: parameters and optimizer state from rank 0
        self.scaler.load_state_dict(meta["scaler"])
        self.step_count, self.micro_step = meta["step"], meta["micro_step"]
        self.skipped_steps = meta["skipped_steps"]
        if meta["world_size"] == self.world_size:
            _set_rng_state(meta["rng"][self.rank])
        return meta["data"]


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------- the loop helper
@dataclass
class FitResult:
    steps: int
    skipped_steps: int
    last_loss: float
    checkpoint: Path | None
    stopped_early: bool  # by a signal or by on_step
    history: list[dict]
    stopped_by_signal: bool = False


def fit(engine: Engine, batches_from: Callable[[int], Iterator[Any]],
        compute_loss: Callable[[torch.nn.Module, Any], Any], *, total_steps: int,
        plan: BatchPlan | None = None, output_dir: str | Path | None = None,
        checkpoint_every: int = 0, keep_checkpoints: int = 3, log_every: int = 10,
        progress: bool = True, log: RunLog | None = None, unit: str = "samples",
        on_step: Callable[[StepResult, dict], bool | None] | None = None) -> FitResult:
    """Train until ``total_steps`` optimizer steps, resuming from ``output_dir``'s newest
    checkpoint: the loop every PyTorch job of the toolkit runs. Reads top to bottom:

    ``batches_from(micro_step)`` yields this rank's micro-batches from that position on (so a
    resumed run continues where the data left off); ``compute_loss(model, batch)`` returns the
    mean loss of one micro-batch, or ``(loss, {name: tensor})`` with more metrics. Every
    ``log_every`` steps the loss and metrics are averaged over ranks and rank 0 records them
    with LR, ``<unit>/s`` and the gradient norm (``log``, a :class:`RunLog`: bar, line,
    metrics.jsonl, TensorBoard). ``on_step(result, metrics)`` runs on every rank after each
    optimizer step (it may run collectives, e.g. an evaluation); returning True stops the run.
    Checkpoints are atomic; SIGTERM saves one and stops.
    """
    plan = plan or getattr(engine, "plan", None)
    if output_dir is not None:
        engine.resume(output_dir)
    own_log = log is None
    if own_log:
        log = RunLog(None, engine.rank, total_steps=total_steps, initial_step=engine.step_count,
                     progress=progress, line_keys=("loss", "lr", f"{unit}_per_s", "grad_norm"))
    log.set_step(engine.step_count)
    if plan is not None:
        log.print(f"batch: {plan.describe()}")  # printed once
    if engine.step_count and output_dir is not None:
        log.print(f"resumed from step {engine.step_count} in {output_dir}")
    engine.install_stop_handler()
    batches = batches_from(engine.micro_step)
    window = MetricWindow(engine.k)
    book = StepBook(engine, log, plan=plan, total_steps=total_steps, log_every=log_every, unit=unit,
                    output_dir=output_dir, checkpoint_every=checkpoint_every,
                    keep_checkpoints=keep_checkpoints, on_step=on_step)
    while engine.step_count < total_steps:
        batch = next(batches)
        with engine.autocast():
            out = compute_loss(engine.model, batch)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        window.add({"loss": loss.detach().float(), **{k: v.detach() for k, v in metrics.items()}})
        if not engine.backward(loss):
            continue
        if book.after_step(engine.step(), window.take()):  # one host sync per optimizer step
            break
    book.finish()
    if own_log:
        log.close()
    return FitResult(engine.step_count, engine.skipped_steps, book.last_loss, book.checkpoint, book.stopped,
                     log.history, book.by_signal)
