"""Elastic training that keeps the recipe: when Horovod elastic (``horovodrun --min-np N
--max-np M --host-discovery-script S``) loses or adds workers, training goes on from the last
commit with the **configured global batch and LR schedule**. ``backward_passes_per_step`` (and,
where the new world size needs it, the local batch) is recomputed from the new world size so
that ``global = local x k x world`` stays exact; where no layout makes it exactly, the job says
so and applies ``train.elastic.uneven``: ``nearest`` (the nearest global batch, the peak LR
rescaled by ``optim.lr_scaling``) or ``wait`` (train nothing until the world changes).

Framework-free: the engines provide ``snapshot()`` / ``restore_snapshot(s)`` (the training
state in host memory), ``sync()`` (rank 0's state to every rank) and ``resize(plan, schedule)``
(the new world's layout); the backends provide Horovod's ``elastic.run`` of their framework.

How one run goes (:func:`fit_elastic`)::

    state.sync()                    # Horovod: rank 0's weights, counters and position to all
    body(state):                    # entered again after every reset
        layout for hvd.size()       # exact, nearest or wait
        first entry only: the job's collectives (run folder, placement) and the disk resume
        micro-batches from the data position of the committed step; after each step:
            snapshot in memory (commit), log/checkpoint, check for new hosts
    a lost worker: HorovodInternalError -> restore the last commit, re-init Horovod, body again
    an added host: HostsUpdatedInterrupt at the next check -> re-init Horovod, body again

Workers that join later run the job from the start, build the model, skip every start-up
collective (they would pair with the others' ``sync``) and take rank 0's state in ``sync``.

The data position is counted in samples over all ranks (the same on every rank); after a
resize each rank starts its new share of the data at ``samples / (world x local)`` micro-batches.
The samples per step are exact; which records fall in the rest of the current epoch depends on
the world size (records of that epoch can repeat or be left out once).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from hvd_bert.core.batch import BatchPlan
from hvd_bert.train.log import MetricWindow, RunLog, StepBook

__all__ = ["launched_elastic", "Layout", "elastic_layout", "fit_elastic"]


def launched_elastic() -> bool:
    """Whether this process was started by ``horovodrun`` in elastic mode."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


@dataclass(frozen=True)
class Layout:
    """The batch layout on one world size: ``plan`` None means wait (no layout chosen)."""

    plan: BatchPlan | None
    target: int          # the configured global batch
    exact: bool

    def describe(self, world_size: int, uneven: str) -> str:
        if self.plan is None:
            return (f"{world_size} ranks cannot make the global batch {self.target} exactly "
                    f"({self.target} is not a multiple of {world_size}); waiting for workers to be "
                    f"added or removed (train.elastic.uneven=wait)")
        head = f"{world_size} ranks: {self.plan.describe()}"
        if self.exact:
            return head + " (the configured global batch, exactly)"
        return (f"{head}: {world_size} ranks cannot make the global batch {self.target} exactly, so "
                f"this is the nearest one; the peak LR is rescaled to it by optim.lr_scaling "
                f"(train.elastic.uneven={uneven})")


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return next(d for d in range(min(n, cap), 0, -1) if n % d == 0)


def elastic_layout(target: int, local_batch_size: int, world_size: int, uneven: str = "nearest") -> Layout:
    """The layout of ``target`` samples per step on ``world_size`` ranks with micro-batches of at
    most ``local_batch_size``: exact when ``world_size`` divides ``target`` (the largest local
    batch up to the configured one that divides the per-rank share, and k from it); otherwise the
    nearest per-rank share (``uneven="nearest"``) or none (``"wait"``)."""
    if target < 1 or local_batch_size < 1 or world_size < 1:
        raise ValueError(f"elastic layout needs positive sizes, got global batch {target}, local batch "
                         f"{local_batch_size}, world size {world_size}")
    if uneven not in ("nearest", "wait"):
        raise ValueError(f"train.elastic.uneven must be 'nearest' or 'wait', got {uneven!r}")
    if target % world_size == 0:
        share = target // world_size
        local = _largest_divisor_at_most(share, local_batch_size)
        return Layout(BatchPlan(local, share // local, world_size), target, True)
    if uneven == "wait":
        return Layout(None, target, False)
    low = max(1, target // world_size)
    # the nearer per-rank share; a tie goes to the one with the larger micro-batch
    share = min((low, low + 1), key=lambda s: (abs(s * world_size - target),
                                               -_largest_divisor_at_most(s, local_batch_size)))
    local = _largest_divisor_at_most(share, local_batch_size)
    return Layout(BatchPlan(local, share // local, world_size), target, False)


def _state_class():
    from horovod.common.elastic import State  # Horovod: (framework-free part)

    class EngineState(State):
        """The training state Horovod elastic commits, restores and syncs: the engine's tensors
        (through the engine) and the loop's plain values (counters, data position)."""

        def __init__(self, engine, values: dict, bcast_object, get_rank):
            self.engine, self.values = engine, values
            super().__init__(bcast_object=bcast_object, get_rank=get_rank)
            self.save()

        def _counters(self) -> tuple:
            e = self.engine
            return e.step_count, e.micro_step, e.skipped_steps, dict(self.values)

        def _set_counters(self, counters) -> None:
            e = self.engine
            e.step_count, e.micro_step, e.skipped_steps, values = counters
            self.values.clear()
            self.values.update(values)

        def save(self) -> None:
            self._saved = (self.engine.snapshot(), self._counters())

        def restore(self) -> None:
            snap, counters = self._saved
            self.engine.restore_snapshot(snap)
            self._set_counters(counters)

        def sync(self) -> None:
            self.engine.sync()
            self._set_counters(self._bcast_object(self._counters(), "hvd_bert.elastic.state"))

    return EngineState


def fit_elastic(engine, batches_from: Callable[[int], Iterator[Any]], *, elastic_run: Callable,
                bcast_object: Callable, target_global_batch: int, local_batch_size: int,
                schedule_for: Callable[[int], Any], elastic_cfg, total_steps: int,
                on_first_entry: Callable[[], None] = lambda: None,
                on_world: Callable[[], None] = lambda: None, output_dir: str | Path | None = None,
                checkpoint_every: int = 0, keep_checkpoints: int = 3, log_every: int = 10,
                log: RunLog, make_writer: Callable[[], Any] | None = None, unit: str = "samples",
                on_step: Callable | None = None, max_skipped_steps: int = 50):
    """:func:`hvd_bert.train.engine.fit` under Horovod elastic (see the module docstring).

    ``elastic_run``: the framework's ``hvd.elastic.run``; ``bcast_object(obj, name)``: Horovod's
    ``broadcast_object`` from rank 0; ``schedule_for(global_batch)``: the LR schedule with the
    peak LR scaled to that global batch; ``on_first_entry``: the job's start-up collectives (run
    once, by the workers that start the run); ``on_world``: collectives after every change of
    the world (e.g. the placement line). ``batches_from(micro_step)`` reads this rank's share
    with the engine's current rank, world size and plan."""
    from hvd_bert.train.engine import FitResult

    # plain values synced with the state; "pending": the last committed step's result and metrics,
    # "posted": whether its logging, checkpoint and hook ran (a lost worker can cut them short)
    values = {"started": False, "samples": 0, "target": target_global_batch, "pending": None, "posted": True}
    # (Horovod's host check broadcasts without a name; every broadcast_object needs one)
    state = _state_class()(engine, values, lambda obj, name="hvd_bert.elastic.hosts": bcast_object(obj, name),
                           lambda: engine.rank)
    book = StepBook(engine, log, plan=None, total_steps=total_steps, log_every=log_every, unit=unit,
                    output_dir=output_dir, checkpoint_every=checkpoint_every,
                    keep_checkpoints=keep_checkpoints, on_step=on_step, max_skipped_steps=max_skipped_steps,
                    data_state=lambda: {"micro_step": engine.micro_step, "samples": values["samples"]})
    engine.install_stop_handler()
    uneven = elastic_cfg.uneven

    def body(state) -> None:
        engine.resize(None, None)  # this world's rank and size
        log.set_rank(engine.rank, make_writer)
        if not values["started"]:
            on_first_entry()
            engine.target_global_batch = values["target"]
            data = engine.resume(output_dir) if output_dir is not None else None
            if engine.step_count:
                log.print(f"resumed from step {engine.step_count} in {output_dir}")
                values["samples"] = (data or {}).get("samples", engine.step_count * values["target"])
            values["started"] = True
            state.save()
        layout = elastic_layout(values["target"], local_batch_size, engine.world_size, uneven)
        unposted = 0 if values["posted"] else 1  # the committed step's bookkeeping is done again
        log.set_step(engine.step_count - unposted)  # (drops the records of steps rolled back)
        book.logged_step = min(book.logged_step, engine.step_count - unposted)
        log.print(f"elastic: {layout.describe(engine.world_size, uneven)}; from step {engine.step_count}")
        on_world()
        if layout.plan is None:
            while True:  # until Horovod reports new or lost hosts (HostsUpdatedInterrupt)
                time.sleep(elastic_cfg.wait_poll_s)
                state.check_host_updates()
        engine.resize(layout.plan, schedule_for(layout.plan.global_batch_size))
        book.plan = layout.plan
        per_micro = layout.plan.local_batch_size * layout.plan.world_size
        engine.micro_step = engine.step_count * engine.k
        batches = iter(batches_from(values["samples"] // per_micro))
        window = MetricWindow(engine.k)
        book.t0, book.steps_since_log = time.perf_counter(), 0
        if unposted:
            stop = book.after_step(*values["pending"])
            values["posted"] = True
            if stop:
                return book.finish()
        while engine.step_count < total_steps:
            result = engine.train_micro_batch(next(batches))
            values["samples"] += per_micro
            window.add(engine.last_metrics)
            if result is None:
                continue
            commit = result.step % elastic_cfg.commit_every == 0 or result.step >= total_steps
            local = window.take()
            if commit:  # before the step's collectives: a lost worker rolls back to here
                values["pending"], values["posted"] = (result, local), False
                state.save()
            stop = book.after_step(result, local)
            values["posted"] = True
            if commit:
                state.check_host_updates()  # Horovod: every rank learns of new hosts together
            if stop:
                break
        book.finish()

    elastic_run(body)(state)
    return FitResult(engine.step_count, engine.skipped_steps, book.last_loss, book.checkpoint, book.stopped,
                     log.history, book.by_signal)
