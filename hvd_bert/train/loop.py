"""The one training loop every job runs, in either framework, launched plainly or by Horovod
elastic::

    result = fit(engine, batches_from)        # a plain run: train.schedule.total_steps, train.output_dir
    result = fit(engine, batches_from, ..., elastic=ElasticHook(...))            # Horovod elastic

``engine`` is a framework's Engine (``train.engine.Engine``). The loop reads a micro-batch,
lets the engine back-propagate it (and, on every k-th, allreduce and step), and after each
optimizer step does the bookkeeping (:class:`StepBook`): the progress bar, the metrics averaged
over ranks every ``log_every`` steps, the checkpoint every ``checkpoint_every`` steps, the job's
``on_step`` hook and the stop signal. A plain run resumes from ``output_dir``'s newest
checkpoint first. An elastic run (``train.elastic.ElasticHook``) wraps the same loop in
Horovod's ``elastic.run`` and hooks into it: it commits the state after a step and checks for
new hosts; nothing else differs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from hvd_bert.core.batch import BatchPlan
from hvd_bert.train.engine import Engine, FitResult, StepResult
from hvd_bert.train.memory import MemoryPhases, memory_line
from hvd_bert.stop import STOP
from hvd_bert.train.log import DivergedError, RunLog, ScalarWriter
from hvd_bert.train.watchdog import Watchdog, end_start

__all__ = ["fit", "start", "train_steps", "resume_line", "batch_line", "StepBook", "MetricWindow"]


def fit(engine: Engine, batches_from: Callable[[int], Iterator[Any]], *, total_steps: int | None = None,
        plan: BatchPlan | None = None, output_dir: str | Path | None | bool = None,
        checkpoint_every: int | None = None, keep_checkpoints: int | None = None,
        log_every: int | None = None,
        progress: bool = True, log: RunLog | None = None, unit: str = "samples",
        on_step: Callable[[StepResult, dict], bool | None] | None = None,
        max_skipped_steps: int | None = None, elastic=None) -> FitResult:
    """Train until ``total_steps`` optimizer steps, resuming from ``output_dir``'s newest
    checkpoint.

    The run's settings are the engine's ``TrainConfig`` (``Engine.from_config``), under the
    names the jobs give them: ``train.schedule.total_steps``, ``train.output_dir``,
    ``train.checkpoint_every``, ``train.keep_checkpoints``, ``train.log_every``,
    ``train.max_skipped_steps``. An argument given here wins; ``output_dir=False``: no run
    folder (no checkpoints, metrics or resume).

    ``batches_from(micro_step)`` yields this rank's micro-batches from that position on (so a
    resumed run continues where the data left off). Every ``log_every`` steps the loss and
    metrics are averaged over ranks and rank 0 records them with LR, ``<unit>/s`` and the
    gradient norm (``log``, a :class:`RunLog`). ``on_step(result, metrics)`` runs on every rank
    after each optimizer step (it may run collectives, e.g. an evaluation); returning True
    stops the run. Checkpoints are atomic; SIGTERM saves one and stops. After
    ``max_skipped_steps`` overflow-skipped steps in a row it raises ``DivergedError`` on every
    rank and writes nothing. ``elastic``: a ``train.elastic.ElasticHook`` under Horovod elastic.
    """
    total_steps, output_dir, checkpoint_every, keep_checkpoints, log_every, max_skipped_steps = _settings(
        engine.config, total_steps, output_dir, checkpoint_every, keep_checkpoints,
        log_every, max_skipped_steps)
    own_log, claim = log is None, None
    if own_log:  # a script's own run: its run folder gets what a job's does (metrics, TensorBoard, config)
        writer = write_config = None
        if output_dir is not None:
            claim, write_config = _claim(engine, Path(output_dir), engine.config)
            writer = ScalarWriter(Path(output_dir) / "tensorboard") if engine.rank == 0 else None
        log = RunLog(output_dir, engine.rank, total_steps=total_steps, initial_step=engine.step_count,
                     progress=progress, line_keys=("loss", "lr", f"{unit}_per_s", "grad_norm"), writer=writer)
        if write_config is not None:
            log.after_resume.append(write_config)
    book = StepBook(engine, log, plan=plan or engine.plan, total_steps=total_steps,
                    log_every=log_every, unit=unit, output_dir=output_dir, checkpoint_every=checkpoint_every,
                    keep_checkpoints=keep_checkpoints, on_step=on_step, max_skipped_steps=max_skipped_steps,
                    data_state=elastic.data_state if elastic is not None else None,
                    stall_timeout_s=engine.config.stall_timeout_s if engine.config is not None else 0.0)
    engine.install_stop_handler()
    end_start()  # (the job's start-up watch: from here on this loop's own watchdog)
    engine.total_steps = total_steps  # (recorded in checkpoints: a resume says when it changed)
    try:
        if elastic is not None:  # the same loop, inside Horovod's elastic.run (train.elastic)
            elastic.run(engine, log, book, batches_from, total_steps, output_dir)
        else:
            with book.watchdog.running():  # (a rank stuck in the resume's collectives: train.watchdog)
                book.watchdog.enter("start")
                start(engine, log, book, output_dir, total_steps)
            if book.plan is not None:
                # (given, or a resume's: the checkpoint's global batch, whatever the layout)
                given = engine.step_count > 0 or (engine.config is not None
                                                  and engine.config.batch.global_batch_size is not None)
                log.print(batch_line(book.plan, engine.tp_size, given))  # once
            log.print(memory_line(engine.memory()))
            train_steps(engine, iter(batches_from(engine.micro_step)), book, total_steps)
            book.finish()
        if own_log and book.phases.line():  # (a job prints it last: jobs.run_folder.finish_line)
            log.print(book.phases.line())  # (which of building, steps, saves or commits set the peak)
    finally:
        if claim is not None:  # (a job's run folder stays claimed until the job exits)
            claim.release()
    if own_log:
        log.close()
    if book.by_signal:
        STOP.consumed()
    return FitResult(engine.step_count, engine.skipped_steps, book.last_loss, book.checkpoint, book.stopped,
                     log.history, book.by_signal, book.phases)


def start(engine: Engine, log: RunLog, book: StepBook, output_dir, total_steps: int) -> Any:
    """The loop's start-up, the same for a plain run and an elastic run's first entry: resume
    from ``output_dir``'s newest checkpoint (on every rank, a collective), the log's records past
    it dropped, the step counters and the clock set, and the resume line. Returns the data state
    the checkpoint holds (None without one)."""
    book.phases.mark("build")  # (the model and the engine: built before the loop starts)
    data = engine.resume(output_dir) if output_dir is not None else None
    if engine.step_count:
        book.phases.mark("resume")
        book.plan = engine.plan or book.plan  # (a resume under a new layout keeps its global batch)
    log.resumed()
    book.saved_step = book.logged_step = engine.step_count
    book.t0 = time.perf_counter()
    log.set_step(engine.step_count)
    if engine.step_count and output_dir is not None:
        log.print(resume_line(engine, output_dir, total_steps))
    return data


def batch_line(plan: BatchPlan, tp: int = 1, global_given: bool = False) -> str:
    """The batch arithmetic, printed once (under tensor parallelism: the replicas and groups, and,
    unless the global batch was given, how to make it the same as without tensor parallelism)."""
    n = plan.world_size
    compare = ("" if global_given else f": 1/{tp} of the global batch of the same command without "
               f"train.tensor_parallel; set train.batch.global_batch_size to compare the two")
    groups = (f" ({n} data-parallel replica{'s' if n != 1 else ''}, each a group of {tp} tensor-parallel "
              f"ranks{compare})") if tp > 1 else ""
    return f"batch: {plan.describe()}{groups}"


def _settings(config, total_steps, output_dir, checkpoint_every, keep_checkpoints, log_every,
              max_skipped_steps) -> tuple:
    """fit()'s arguments, each one not given taken from the engine's TrainConfig (else the
    TrainConfig defaults); ``output_dir`` False becomes None (no run folder)."""
    from hvd_bert.config import ConfigError, TrainConfig

    c = config if config is not None else TrainConfig()
    if total_steps is None:
        if config is None:
            raise ConfigError("fit() needs the run's length: pass total_steps=, or build the engine with "
                              "Engine.from_config (its train.schedule.total_steps)")
        total_steps = c.schedule.total_steps
    if output_dir is None:
        output_dir = c.output_dir if config is not None else None
    output_dir = None if output_dir is False or output_dir == "" else output_dir
    pick = lambda given, default: default if given is None else given  # noqa: E731
    return (total_steps, output_dir, pick(checkpoint_every, c.checkpoint_every),
            pick(keep_checkpoints, c.keep_checkpoints), pick(log_every, c.log_every),
            pick(max_skipped_steps, c.max_skipped_steps))


def _claim(engine: Engine, out: Path, config):
    """A script's own ``fit`` on a run folder claims it as a job does (``train.run_folder``: the
    lock, planted links, checkpoints of a run with other settings), until it returns. Returns
    the claim (None off rank 0) and what writes the resolved ``config.json`` once the checkpoint
    was resumed (None on other ranks or without the engine's TrainConfig)."""
    from hvd_bert.config import to_dict
    from hvd_bert.files import atomic_write
    from hvd_bert.train.run_folder import claim_run_folder, raise_problem

    record = {"train": to_dict(config)} if config is not None else {}
    claim = claim_run_folder(out, record, hold_until_exit=False) if engine.rank == 0 else None
    problem = claim.problem if claim is not None else None
    if engine.any_rank(problem is not None, "hvd_bert.fit.config"):  # Horovod: every rank stops
        raise_problem(problem or ("resume", f"rank 0 refused to use {out} as the run folder (its message "
                                            f"says why)"))
    if claim is None or config is None:
        return claim, None
    return claim, lambda: atomic_write(out / "config.json",
                                       lambda t: t.write_text(json.dumps(record, indent=1)))


def resume_line(engine: Engine, output_dir, total_steps: int) -> str:
    """What a resumed run continues with: the step, the steps to go, the LR now, and the horizon
    when it changed since the checkpoint was written."""
    step = engine.step_count
    line = f"resumed from step {step} in {output_dir}: {max(0, total_steps - step)} steps to go"
    if step < total_steps:
        line += f", lr now {engine.schedule(step + 1):.4g}"
    meta = engine.resumed_meta or {}
    old = meta.get("total_steps")
    if old is not None and old != total_steps:
        line += f"; the horizon changed from {old} to {total_steps} steps"
    plan, was = engine.plan, (meta.get("data_parallel_size", meta.get("world_size")),
                              meta.get("backward_passes_per_step"))
    if plan is not None and None not in was and was != (plan.world_size, plan.backward_passes_per_step):
        line += (f"; the layout changed from {was[0]} data-parallel replica{'s' if was[0] != 1 else ''} x "
                 f"k={was[1]} to {plan.world_size} x k={plan.backward_passes_per_step}, the global batch of "
                 f"{plan.global_batch_size} kept")
    return line


class _Plain:
    """The loop's hooks of a plain run: nothing happens around a step."""

    def after_micro_batch(self) -> None: ...

    def before_bookkeeping(self, result: StepResult, local: dict) -> None: ...

    def after_bookkeeping(self) -> None: ...


PLAIN = _Plain()


def train_steps(engine: Engine, batches: Iterator[Any], book: StepBook, total_steps: int,
                hooks=PLAIN) -> None:
    """The loop itself: micro-batches until ``total_steps`` optimizer steps or a stop.
    ``hooks`` (an elastic run's) see each micro-batch and each step before and after its
    bookkeeping (which may run collectives). Each step's outcome stays on the device until the
    loop reads it (``engine.finish_steps``: one transfer): after every step, or with
    ``train.host_reads=log`` only where the bookkeeping needs it (:meth:`StepBook.must_read`);
    between reads only the stop request is checked, every step."""
    window = MetricWindow(engine.k)
    dog = book.watchdog
    unread: list = []  # (outcome, metric sums) of the steps not read yet
    with dog.running():  # (a rank that stalls in any phase ends the job with one line: train.watchdog)
        while engine.step_count + len(unread) < total_steps:
            dog.enter("data")
            batch = next(batches)
            dog.enter("step")
            result = engine.train_micro_batch(batch, defer=True)
            window.add(engine.last_metrics)
            hooks.after_micro_batch()
            if result is None:
                continue
            unread.append((result, window.take()))
            dog.enter("bookkeeping")
            stopping = None  # (a stop request seen between reads: read now)
            if not book.must_read(engine.step_count + len(unread), len(unread), hooks is PLAIN):
                stopping = engine.should_stop()  # SIGTERM on any rank (a collective)
                if not stopping:
                    continue
            steps, unread = engine.finish_steps(unread), []  # the window's one host read
            stop = False
            for i, (result, local) in enumerate(steps):
                hooks.before_bookkeeping(result, local)
                # (the steps before the last were checked for a stop request as they ran)
                checked = False if i < len(steps) - 1 else stopping
                stop = book.after_step(result, local, stop_requested=checked)
                hooks.after_bookkeeping()
                if stop:
                    break
            if stop:
                break


class MetricWindow:
    """Sums of per-micro-batch metrics over an optimizer step's ``k`` micro-batches, kept as the
    framework's scalars (no host read); ``take()`` gives their means, for the engine's
    ``finish_step`` to read with the step's outcome, and starts over."""

    def __init__(self, k: int):
        self.k = k
        self.sums: dict[str, Any] = {}

    def add(self, metrics: dict) -> None:
        for name, v in metrics.items():
            self.sums[name] = self.sums.get(name, 0.0) + v / self.k

    def take(self) -> dict[str, Any]:
        out, self.sums = self.sums, {}
        return out


class StepBook:
    """The bookkeeping of :func:`fit` after each optimizer step: the
    progress bar, the metrics averaged over ranks and recorded every ``log_every`` steps (with
    LR, ``<unit>/s``, gradient norm, loss scale), the periodic checkpoint, the ``on_step`` hook,
    and the stop signal. ``engine`` is either frontend's Engine (``average``, ``save``,
    ``should_stop``, ``step_count``, ``micro_step``, ``skipped_steps``)."""

    def __init__(self, engine, log: RunLog, *, plan=None, total_steps: int, log_every: int, unit: str,
                 output_dir=None, checkpoint_every: int = 0, keep_checkpoints: int = 3, on_step=None,
                 max_skipped_steps: int = 50, data_state=None, stall_timeout_s: float = 0.0):
        self.engine, self.log, self.plan, self.total = engine, log, plan, total_steps
        self.watchdog = Watchdog(STOP.command, engine.rank, stall_timeout_s, step=lambda: engine.step_count,
                                 checkpoint=lambda: self.saved_step if self.output_dir is not None else None)
        # what a checkpoint records of the data position (default: the micro-batch counter)
        self.data_state = data_state or (lambda: {"micro_step": engine.micro_step})
        self.log_every, self.unit, self.output_dir = log_every, unit, output_dir
        self.checkpoint_every, self.keep, self.on_step = checkpoint_every, keep_checkpoints, on_step
        self.saved_step, self.checkpoint = engine.step_count, None
        self.t0, self.steps_since_log, self.last_loss = time.perf_counter(), 0, float("nan")
        self.stopped = self.by_signal = False
        self.max_skipped, self.skipped_in_a_row = max_skipped_steps, 0
        self.logged_step = engine.step_count  # a resumed run logged this step already
        self.phases = MemoryPhases(lambda: engine.memory()["peak"])

    def must_read(self, step: int, unread: int, plain: bool) -> bool:
        """Whether the loop reads its unread steps' outcomes now, at ``step`` as the host counts it
        (the unread ones counted as applied): always with ``train.host_reads=step``, an elastic
        run's hooks (``plain`` False) or an ``on_step`` hook; else where a log, a checkpoint or the
        end is due, and before ``max_skipped_steps`` unread steps could all have been skipped."""
        config = self.engine.config  # (None for an engine built by hand: read every step)
        if config is None or config.host_reads == "step" or not plain or self.on_step is not None:
            return True
        return (step >= self.total or step % self.log_every == 0 or unread >= self.max_skipped
                or bool(self.output_dir is not None and self.checkpoint_every
                        and step % self.checkpoint_every == 0))

    def after_step(self, result, local: dict, stop_requested: bool | None = None) -> bool:
        """Account for one optimizer step (``local``: this rank's metric means over its
        micro-batches). Returns True when the run must stop (every rank returns the same).
        ``stop_requested``: the stop request as the loop already checked it (None: check it)."""
        self.phases.mark("steps")
        e = self.engine
        self.steps_since_log += 1
        self.last_loss = local["loss"]
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if result.skipped else 0
        if self.skipped_in_a_row >= self.max_skipped:  # the same on every rank: raised on all
            raise DivergedError(
                f"the last {self.skipped_in_a_row} optimizer steps were all skipped for inf/NaN gradients "
                f"(step {result.step}, lr {result.lr:.3g}): the run diverged and no checkpoint of it was "
                f"written; lower train.optim.lr, use train.precision.mode=fp32 or bf16, or raise "
                f"train.max_skipped_steps")
        if not result.skipped:
            self.log.advance()
        # a skipped step does not advance the count: log each step once, not once per retry
        due = result.step % self.log_every == 0 or result.step == self.total
        if due and result.step != self.logged_step:
            self.logged_step = result.step
            mean = {k: e.average(v, f"hvd_bert.{k}") for k, v in local.items()}  # collectives
            dt = time.perf_counter() - self.t0
            rate = (self.plan.global_batch_size * self.steps_since_log / dt if self.plan and dt > 0
                    else float("nan"))
            self.log.record(dict(step=result.step, **mean, lr=result.lr, **{f"{self.unit}_per_s": rate},
                                 grad_norm=result.grad_norm, loss_scale=result.loss_scale,
                                 skipped_steps=e.skipped_steps, time=time.time()))
            self.t0, self.steps_since_log = time.perf_counter(), 0
        if (self.output_dir is not None and self.checkpoint_every
                and result.step % self.checkpoint_every == 0 and result.step != self.saved_step):
            self.save()
        if self.on_step is not None and not result.skipped and self.on_step(result, local):
            self.stopped = True  # (a skipped step applied nothing: no evaluation of it again)
        elif e.should_stop() if stop_requested is None else stop_requested:  # SIGTERM on any rank
            self.stopped = self.by_signal = True
        return self.stopped

    def save(self) -> None:
        e = self.engine
        self.checkpoint = e.save(self.output_dir, self.data_state(), self.keep)
        self.saved_step = e.step_count
        self.phases.mark("save")

    def finish(self) -> None:
        """The final checkpoint, unless this step's is already written."""
        if self.output_dir is not None and self.saved_step != self.engine.step_count:
            self.save()
        self.engine.wait_for_save()  # (a background save: on disk before the run returns, or its error)
        self.phases.mark("save")
