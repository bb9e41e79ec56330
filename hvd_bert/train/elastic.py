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

How one run goes (:class:`ElasticHook`, the hook of ``train.loop.fit``)::

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

from hvd_bert.core.batch import BatchPlan, largest_divisor_at_most
from hvd_bert.train.log import RunLog

__all__ = ["launched_elastic", "Layout", "elastic_layout", "ElasticHook", "launch_mode", "PlainLaunch",
           "ElasticLaunch"]


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
                f"this is the nearest one; the peak LR is rescaled to it by train.optim.lr_scaling "
                f"(train.elastic.uneven={uneven})")


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
        local = largest_divisor_at_most(share, local_batch_size)
        return Layout(BatchPlan(local, share // local, world_size), target, True)
    if uneven == "wait":
        return Layout(None, target, False)
    low = max(1, target // world_size)
    # the nearer per-rank share; a tie goes to the one with the larger micro-batch
    share = min((low, low + 1), key=lambda s: (abs(s * world_size - target),
                                               -largest_divisor_at_most(s, local_batch_size)))
    local = largest_divisor_at_most(share, local_batch_size)
    return Layout(BatchPlan(local, share // local, world_size), target, False)


def _state_class():
    from horovod.common.elastic import State  # Horovod: (framework-free part)

    class EngineState(State):
        """The training state Horovod elastic commits, restores and syncs: the engine's tensors
        (through the engine) and the loop's plain values (counters, data position)."""

        def __init__(self, engine, values: dict, bcast_object, get_rank):
            self.engine, self.values = engine, values
            super().__init__(bcast_object=bcast_object, get_rank=get_rank)
            # nothing saved until the first entry's commit: a snapshot can be a collective (ZeRO),
            # which a worker that joins later must not start alone; sync gives it rank 0's state
            self._saved = None

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
            if self._saved is None:  # (lost before its first commit: sync brings rank 0's state)
                return
            snap, counters = self._saved
            self.engine.restore_snapshot(snap)
            self._set_counters(counters)

        def sync(self) -> None:
            self.engine.sync()
            self._set_counters(self._bcast_object(self._counters(), "hvd_bert.elastic.state"))

    return EngineState


class ElasticHook:
    """What :func:`hvd_bert.train.loop.fit` does differently under Horovod elastic (see the
    module docstring): it runs the loop inside ``elastic_run`` and, around each step, commits
    the state and checks for new hosts.

    ``elastic_run``: the framework's ``hvd.elastic.run``; ``bcast_object(obj, name)``: Horovod's
    ``broadcast_object`` from rank 0; ``schedule_for(global_batch)``: the LR schedule with the
    peak LR scaled to that global batch; ``on_first_entry``: the job's start-up collectives (run
    once, by the workers that start the run); ``on_world``: collectives after every change of
    the world (e.g. the placement line). The loop's ``batches_from(micro_step)`` reads this
    rank's share with the engine's current rank, world size and plan."""

    def __init__(self, *, elastic_run: Callable, bcast_object: Callable, target_global_batch: int,
                 local_batch_size: int, schedule_for: Callable[[int], Any], elastic_cfg,
                 on_first_entry: Callable[[], None] = lambda: None,
                 on_world: Callable[[], None] = lambda: None, make_writer: Callable[[], Any] | None = None):
        self.elastic_run, self.bcast_object = elastic_run, bcast_object
        self.local_batch_size, self.schedule_for, self.cfg = local_batch_size, schedule_for, elastic_cfg
        self.on_first_entry, self.on_world, self.make_writer = on_first_entry, on_world, make_writer
        # plain values synced with the state; "pending": the last committed step's result and
        # metrics, "posted": whether its logging, checkpoint and hook ran (a lost worker can cut
        # them short)
        self.values = {"started": False, "samples": 0, "target": target_global_batch, "pending": None,
                       "posted": True}
        self.engine = self.state = self.book = None
        self.per_micro, self.total_steps, self.commit = 0, 0, False

    def data_state(self) -> dict:
        """What a checkpoint records of the data position: samples over all ranks too."""
        return {"micro_step": self.engine.micro_step, "samples": self.values["samples"]}

    def run(self, engine, log: RunLog, book, batches_from: Callable[[int], Iterator[Any]], total_steps: int,
            output_dir: str | Path | None) -> None:
        from hvd_bert.train.loop import start, train_steps

        values = self.values
        self.engine, self.total_steps, self.book = engine, total_steps, book
        # (Horovod's host check broadcasts without a name; every broadcast_object needs one)
        self.state = state = _state_class()(
            engine, values, lambda obj, name="hvd_bert.elastic.hosts": self.bcast_object(obj, name),
            lambda: engine.rank)

        def body(state) -> None:
            engine.resize(None, None)  # this world's rank and size
            log.set_rank(engine.rank, self.make_writer)
            cut = engine.abandon_save()  # (a sharded save the lost rank never finished)
            if cut is not None:
                log.print(f"elastic: the world changed while {cut.name} was being written: that save was "
                          f"abandoned (no index.json: never resumed from, removed at the next start); the "
                          f"last complete checkpoint stays, and the next save writes a new one")
            if not values["started"]:
                self.on_first_entry()
                engine.target_global_batch = values["target"]
                data = start(engine, log, book, output_dir, total_steps)  # (fit's own start-up)
                if engine.step_count:
                    values["samples"] = (data or {}).get("samples", engine.step_count * values["target"])
                values["started"] = True
                state.save()
            layout = elastic_layout(values["target"], self.local_batch_size, engine.world_size,
                                    self.cfg.uneven)
            unposted = 0 if values["posted"] else 1  # the committed step's bookkeeping is done again
            log.set_step(engine.step_count - unposted)  # (drops the records of steps rolled back)
            book.logged_step = min(book.logged_step, engine.step_count - unposted)
            log.print(f"elastic: {layout.describe(engine.world_size, self.cfg.uneven)}; "
                      f"from step {engine.step_count}")
            if engine.zero is not None:  # (the shards are this world's)
                from hvd_bert.train.memory import memory_line
                log.print(memory_line(engine.memory()))
            self.on_world()
            if layout.plan is None:
                while True:  # until Horovod reports new or lost hosts (HostsUpdatedInterrupt)
                    time.sleep(self.cfg.wait_poll_s)
                    state.check_host_updates()
            engine.resize(layout.plan, self.schedule_for(layout.plan.global_batch_size))
            book.plan = layout.plan
            self.per_micro = layout.plan.local_batch_size * layout.plan.world_size
            engine.micro_step = engine.step_count * engine.k
            batches = iter(batches_from(values["samples"] // self.per_micro))
            book.t0, book.steps_since_log = time.perf_counter(), 0
            if unposted:
                stop = book.after_step(*values["pending"])
                values["posted"] = True
                if stop:
                    return book.finish()
            train_steps(engine, batches, book, total_steps, hooks=self)
            book.finish()

        self.elastic_run(body)(state)

    # the loop's hooks
    def after_micro_batch(self) -> None:
        self.values["samples"] += self.per_micro

    def before_bookkeeping(self, result, local: dict) -> None:
        self.commit = result.step % self.cfg.commit_every == 0 or result.step >= self.total_steps
        if self.commit:  # before the step's collectives: a lost worker rolls back to here
            self.values["pending"], self.values["posted"] = (result, local), False
            self.state.save()
            self.book.phases.mark("commit")

    def after_bookkeeping(self) -> None:
        self.values["posted"] = True
        if self.commit:
            self.state.check_host_updates()  # Horovod: every rank learns of new hosts together


# ---------------------------------------------------------------------- how the job was launched
class PlainLaunch:
    """A job launched once on a fixed world (horovodrun, mpirun, srun): its start-up
    collectives run at once, rank 0 reads what all need and broadcasts it, the engine
    broadcasts rank 0's weights when it is built, and ``fit`` runs the plain loop."""

    syncs_at_start = True

    def reads_here(self, rank: int) -> bool:
        return rank == 0

    def shared(self, broadcast_object: Callable, value, name: str):
        return broadcast_object(value, name)  # Horovod: rank 0's value on every rank

    def layout(self, train, world_size: int):
        return train

    def at_start(self, *collectives: Callable[[], None]) -> None:
        for c in collectives:
            c()

    def on_world(self, collective: Callable[[], None]) -> None:
        collective()

    def hook(self, backend, train, make_writer=None) -> ElasticHook | None:
        return None


class ElasticLaunch(PlainLaunch):
    """A job launched by ``horovodrun --min-np/--max-np`` (Horovod elastic): no collective before
    the state sync inside ``elastic.run`` (a worker that joins later would pair with it), so every
    rank reads what rank 0 would have broadcast, the start-up collectives run on the first entry
    and the placement after every change of the world, and the configured global batch is laid
    out on each world (k recomputed)."""

    syncs_at_start = False

    def __init__(self):
        self.first: list[Callable[[], None]] = []
        self.every_world: list[Callable[[], None]] = []
        self.target = self.cap = 0

    def reads_here(self, rank: int) -> bool:
        return True

    def shared(self, broadcast_object: Callable, value, name: str):
        return value

    def layout(self, train, world_size: int):
        from dataclasses import replace

        from hvd_bert.config import BatchConfig

        b = train.batch
        self.target = b.global_batch_size or b.plan(world_size).global_batch_size
        self.cap = b.local_batch_size or b.plan(world_size).local_batch_size
        plan = elastic_layout(self.target, self.cap, world_size, train.elastic.uneven).plan
        return replace(train, resume_resized=True, batch=BatchConfig(
            local_batch_size=plan.local_batch_size if plan else self.cap,
            backward_passes_per_step=plan.backward_passes_per_step if plan else 1))

    def at_start(self, *collectives: Callable[[], None]) -> None:
        self.first.extend(collectives)

    def on_world(self, collective: Callable[[], None]) -> None:
        self.every_world.append(collective)

    def hook(self, backend, train, make_writer=None) -> ElasticHook:
        from hvd_bert.core.schedules import make_schedule

        return ElasticHook(elastic_run=backend.elastic_run, bcast_object=backend.broadcast_object,
                           target_global_batch=self.target, local_batch_size=self.cap,
                           schedule_for=lambda g: make_schedule(train.schedule, train.optim.peak_lr(g)),
                           elastic_cfg=train.elastic, make_writer=make_writer,
                           on_first_entry=lambda: [c() for c in self.first],
                           on_world=lambda: [c() for c in self.every_world])


def launch_mode() -> PlainLaunch:
    """How this process was launched: :class:`ElasticLaunch` under Horovod elastic, else
    :class:`PlainLaunch`. A job asks it instead of branching on elastic."""
    return ElasticLaunch() if launched_elastic() else PlainLaunch()

