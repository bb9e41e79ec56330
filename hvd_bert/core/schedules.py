"""Learning-rate schedules as pure ``step -> lr`` functions, and batch-size scaling rules.

A schedule is a small frozen dataclass with ``__call__(step) -> float``: it is pure,
picklable, prints its settings, and composes with :func:`join_schedules` (optax style).
``step`` is the optimizer step count ``t`` (1 for the first update; skipped overflow steps
do not advance it). Each schedule accepts any integer ``step >= 0``.

References:
    Goyal et al. 2017, "Accurate, Large Minibatch SGD" (arXiv:1706.02677): linear scaling
        and gradual warmup.
    You et al. 2019, "Large Batch Optimization for Deep Learning" (arXiv:1904.00962):
        square-root scaling for LAMB.
    NVIDIA DeepLearningExamples BERT ``PolyWarmUpScheduler``: BERT's warmup-decay.
    MLPerf ResNet-50 LARS reference: linear warmup then polynomial decay (power 2).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable, Sequence

Schedule = Callable[[int], float]

__all__ = [
    "Schedule", "Constant", "LinearWarmup", "PolyWarmupDecay", "StepDecay", "PolynomialDecay",
    "Joined", "join_schedules", "goyal_warmup", "warmup_poly_decay", "linear_scaled_lr",
    "sqrt_scaled_lr", "lamb_paper_lr", "lamb_paper_warmup_ratio", "make_schedule",
]


def _check_step(step: int) -> int:
    if step < 0:
        raise ValueError(f"schedule step must be >= 0, got {step}")
    return step


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


@dataclass(frozen=True)
class Constant:
    """``lr = value`` at every step."""

    value: float

    def __call__(self, step: int) -> float:
        _check_step(step)
        return float(self.value)


@dataclass(frozen=True)
class LinearWarmup:
    """Linear ramp from ``init`` (step 0) to ``peak`` (step ``warmup_steps``), then ``peak``.

    With ``init = base_lr`` and ``peak = scaled_lr`` this is Goyal et al.'s gradual warmup;
    with ``init = 0`` it is the usual warmup from zero.
    """

    peak: float
    warmup_steps: int
    init: float = 0.0

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")

    def __call__(self, step: int) -> float:
        _check_step(step)
        if self.warmup_steps == 0 or step >= self.warmup_steps:
            return float(self.peak)
        return float(self.init + (self.peak - self.init) * step / self.warmup_steps)


@dataclass(frozen=True)
class PolyWarmupDecay:
    """BERT's warmup then polynomial decay (NVIDIA ``PolyWarmUpScheduler``).

    With ``p = step / total_steps``: ``lr = base * p / warmup`` while ``p < warmup``, else
    ``base * (1 - p) ** power``; 0 from ``total_steps`` on. ``warmup`` is a proportion of
    ``total_steps``. NVIDIA uses ``power=0.5``; Google BERT uses ``power=1.0``.
    """

    base: float
    warmup: float
    total_steps: int
    power: float = 0.5

    def __post_init__(self) -> None:
        _positive("total_steps", self.total_steps)
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"warmup is a proportion of total_steps in [0, 1), got {self.warmup}")

    def __call__(self, step: int) -> float:
        _check_step(step)
        p = step / self.total_steps
        if p >= 1.0:
            return 0.0
        if p < self.warmup:
            return float(self.base * p / self.warmup)
        return float(self.base * (1.0 - p) ** self.power)


@dataclass(frozen=True)
class StepDecay:
    """``lr = base * factor ** k`` where ``k`` counts the boundaries ``<= step``."""

    base: float
    boundaries: tuple[int, ...]
    factor: float = 0.1

    def __post_init__(self) -> None:
        b = tuple(self.boundaries)
        if list(b) != sorted(b) or len(set(b)) != len(b):
            raise ValueError(f"boundaries must be strictly increasing, got {b}")
        object.__setattr__(self, "boundaries", b)

    def __call__(self, step: int) -> float:
        _check_step(step)
        return float(self.base * self.factor ** bisect.bisect_right(self.boundaries, step))


@dataclass(frozen=True)
class PolynomialDecay:
    """``lr = (init - end) * (1 - min(step, decay_steps) / decay_steps) ** power + end``.

    ``power=2`` is the LARS (MLPerf ResNet-50) decay.
    """

    init: float
    decay_steps: int
    end: float = 0.0
    power: float = 2.0

    def __post_init__(self) -> None:
        _positive("decay_steps", self.decay_steps)

    def __call__(self, step: int) -> float:
        _check_step(step)
        frac = 1.0 - min(step, self.decay_steps) / self.decay_steps
        return float((self.init - self.end) * frac ** self.power + self.end)


@dataclass(frozen=True)
class Joined:
    """``schedules[i]`` on ``[boundaries[i-1], boundaries[i])``, fed ``step - boundaries[i-1]``."""

    schedules: tuple[Schedule, ...]
    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.schedules) != len(self.boundaries) + 1:
            raise ValueError(f"join_schedules needs one more schedule than boundaries, got "
                             f"{len(self.schedules)} schedules and {len(self.boundaries)} boundaries")
        b = tuple(self.boundaries)
        if any(x < 0 for x in b) or list(b) != sorted(b):
            raise ValueError(f"boundaries must be non-negative and increasing, got {b}")
        object.__setattr__(self, "schedules", tuple(self.schedules))
        object.__setattr__(self, "boundaries", b)

    def __call__(self, step: int) -> float:
        _check_step(step)
        i = bisect.bisect_right(self.boundaries, step)
        offset = self.boundaries[i - 1] if i > 0 else 0
        return self.schedules[i](step - offset)


def join_schedules(schedules: Sequence[Schedule], boundaries: Sequence[int]) -> Joined:
    """Join schedules at ``boundaries`` (each later schedule restarts its step count at 0)."""
    return Joined(tuple(schedules), tuple(boundaries))


def goyal_warmup(base_lr: float, base_batch: int, global_batch: int, warmup_steps: int) -> LinearWarmup:
    """Goyal et al.: warm up linearly from ``base_lr`` to the linearly scaled lr, then hold."""
    return LinearWarmup(peak=linear_scaled_lr(base_lr, base_batch, global_batch),
                        warmup_steps=warmup_steps, init=base_lr)


def warmup_poly_decay(peak: float, warmup_steps: int, total_steps: int, end: float = 0.0,
                      power: float = 2.0) -> Joined:
    """Linear warmup from 0 to ``peak``, then polynomial decay to ``end`` at ``total_steps``
    (the MLPerf LARS schedule with ``power=2``)."""
    if not 0 <= warmup_steps < total_steps:
        raise ValueError(f"need 0 <= warmup_steps < total_steps, got {warmup_steps} and {total_steps}")
    return join_schedules([LinearWarmup(peak, warmup_steps),
                           PolynomialDecay(peak, total_steps - warmup_steps, end, power)],
                          [warmup_steps])


def linear_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    """Linear scaling rule: ``base_lr * global_batch / base_batch``."""
    _positive("base_batch", base_batch)
    _positive("global_batch", global_batch)
    return base_lr * global_batch / base_batch


def sqrt_scaled_lr(base_lr: float, base_batch: int, global_batch: int) -> float:
    """Square-root scaling rule: ``base_lr * sqrt(global_batch / base_batch)``."""
    _positive("base_batch", base_batch)
    _positive("global_batch", global_batch)
    return base_lr * math.sqrt(global_batch / base_batch)


def lamb_paper_lr(global_batch: int) -> float:
    """The LAMB paper's untuned rule: ``5e-3 * sqrt(B / 32768)``."""
    return sqrt_scaled_lr(5e-3, 32768, global_batch)


def lamb_paper_warmup_ratio(global_batch: int) -> float:
    """The LAMB paper's untuned warmup proportion: ``(B / 32768) / 5``."""
    _positive("global_batch", global_batch)
    return global_batch / 32768 / 5


def make_schedule(cfg, peak_lr: float) -> Schedule:
    """The ``step -> lr`` function that a ``hvd_bert.config.ScheduleConfig`` describes, peaking
    at ``peak_lr`` (the optimizer's LR scaled to the global batch)."""
    if cfg.name == "constant":
        return Constant(peak_lr)
    if cfg.name == "linear_warmup":
        return LinearWarmup(peak_lr, cfg.warmup_steps, cfg.warmup_init_lr)
    if cfg.name == "poly_warmup":
        return PolyWarmupDecay(peak_lr, cfg.warmup, cfg.total_steps, cfg.power)
    if cfg.name == "warmup_poly_decay":
        return warmup_poly_decay(peak_lr, cfg.warmup_steps, cfg.total_steps, cfg.end_lr, cfg.power)
    if cfg.name == "step":
        return StepDecay(peak_lr, cfg.boundaries, cfg.factor)
    raise ValueError(f"train.schedule.name: unknown schedule {cfg.name!r}; choose constant, linear_warmup, "
                     f"poly_warmup, warmup_poly_decay or step")
