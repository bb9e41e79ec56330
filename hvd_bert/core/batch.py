"""Batch arithmetic: ``global_batch_size = local_batch_size * backward_passes_per_step *
world_size``, and the accumulation boundary as a pure function of the micro-batch counter.

Names carry their scope: ``local_batch_size`` is one micro-batch on one rank;
``backward_passes_per_step`` (Horovod's name, ``k``) micro-batches are accumulated before one
allreduce and one optimizer step; ``world_size`` ranks take part.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchPlan", "plan_batch", "largest_divisor_at_most", "is_sync_step", "optimizer_steps_done"]


@dataclass(frozen=True)
class BatchPlan:
    """A validated batch layout (build it with :func:`plan_batch`)."""

    local_batch_size: int
    backward_passes_per_step: int
    world_size: int

    @property
    def global_batch_size(self) -> int:
        return self.local_batch_size * self.backward_passes_per_step * self.world_size

    @property
    def samples_per_rank_per_step(self) -> int:
        return self.local_batch_size * self.backward_passes_per_step

    def describe(self) -> str:
        """One line for the start-of-run log."""
        return (f"global batch {self.global_batch_size} = local batch {self.local_batch_size}"
                f" x backward_passes_per_step {self.backward_passes_per_step}"
                f" x world size {self.world_size}")


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is at most ``cap`` (a local batch that divides a share)."""
    return next(d for d in range(min(n, cap), 0, -1) if n % d == 0)


def plan_batch(*, world_size: int, local_batch_size: int | None = None,
               backward_passes_per_step: int | None = None,
               global_batch_size: int | None = None, largest_local: int | None = None) -> BatchPlan:
    """Resolve and validate a batch layout.

    Give any two of ``local_batch_size``, ``backward_passes_per_step`` and
    ``global_batch_size`` (``backward_passes_per_step`` defaults to 1 when only the local size
    is given), or all three if they agree. The missing one is derived; a global batch that the
    other numbers cannot produce is an error that names the numbers and a fix. The global batch
    alone (with ``largest_local``): the largest local batch up to ``largest_local`` that makes it
    with a whole number of micro-batches per rank, and that number.
    """
    world_size = _check_positive_int("world_size", world_size)
    for name, v in (("local_batch_size", local_batch_size),
                    ("backward_passes_per_step", backward_passes_per_step),
                    ("global_batch_size", global_batch_size)):
        if v is not None:
            _check_positive_int(name, v)
    local, k, glob = local_batch_size, backward_passes_per_step, global_batch_size
    if local is None and k is None and glob is not None and largest_local:
        if glob % world_size:
            raise ValueError(f"global_batch_size {glob} is not a multiple of {_ranks(world_size)}: each "
                             f"takes an equal share; use "
                             f"{max(1, round(glob / world_size)) * world_size}, or start a number of ranks "
                             f"that divides {glob}")
        local = largest_divisor_at_most(glob // world_size, largest_local)
    if local is None and (k is None or glob is None):
        raise ValueError("give local_batch_size, or both global_batch_size and "
                         "backward_passes_per_step")
    if local is not None and k is None:
        if glob is None:
            k = 1
        else:
            per_step = local * world_size
            if glob % per_step:
                raise ValueError(
                    f"global_batch_size {glob} is not a multiple of local_batch_size {local} x "
                    f"{_ranks(world_size)} = {per_step}; use a global batch that is a multiple "
                    f"of {per_step} (e.g. {max(1, round(glob / per_step)) * per_step}) or change "
                    f"the local batch size")
            k = glob // per_step
    if local is None:
        per_step = k * world_size
        if glob % per_step:
            raise ValueError(
                f"global_batch_size {glob} is not a multiple of backward_passes_per_step {k} x "
                f"{_ranks(world_size)} = {per_step}; use a global batch that is a multiple of "
                f"{per_step} or change backward_passes_per_step")
        local = glob // per_step
    plan = BatchPlan(local, k, world_size)
    if glob is not None and plan.global_batch_size != glob:
        raise ValueError(
            f"inconsistent batch sizes: local_batch_size {local} x backward_passes_per_step {k} x "
            f"{_ranks(world_size)} = {plan.global_batch_size}, but global_batch_size is {glob}; "
            f"drop one of the three settings to have it derived, or make them agree")
    return plan


def _ranks(n: int) -> str:
    """The ranks a batch is split over: the data-parallel replicas (the world size, divided by
    train.tensor_parallel where a group of ranks shares one batch)."""
    return f"{n} data-parallel rank{'s' if n != 1 else ''}"


def is_sync_step(micro_step: int, backward_passes_per_step: int) -> bool:
    """Whether micro-batch number ``micro_step`` (0-based, counted over the whole run) is the
    last of its accumulation window: the one after which gradients are reduced and applied."""
    if micro_step < 0:
        raise ValueError(f"micro_step must be >= 0, got {micro_step}")
    _check_positive_int("backward_passes_per_step", backward_passes_per_step)
    return (micro_step + 1) % backward_passes_per_step == 0


def optimizer_steps_done(micro_steps: int, backward_passes_per_step: int) -> int:
    """How many optimizer steps ``micro_steps`` completed micro-batches contain."""
    _check_positive_int("backward_passes_per_step", backward_passes_per_step)
    return micro_steps // backward_passes_per_step
