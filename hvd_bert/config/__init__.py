"""Typed configuration: frozen dataclasses with documented fields and checks, loaded from
YAML (safe loader) with type-checked command-line overrides (``--set optim.lr=1e-3``).

An unknown key or a value of the wrong type is a :class:`ConfigError` that names the key
(``optim.lr``), what was given and what is expected. Field documentation lives where the
field is declared (``doc(...)``) and is printed by ``hvd-bert config --explain``.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Sequence

from hvd_bert.core.batch import BatchPlan, plan_batch
from hvd_bert.core.optim import BERT_EXCLUDE, LARS_EXCLUDE, name_mask
from hvd_bert.core import schedules as S

__all__ = ["ConfigError", "doc", "from_dict", "to_dict", "load_config", "apply_overrides",
           "explain", "OptimConfig", "ScheduleConfig", "BatchConfig", "PrecisionConfig",
           "HorovodConfig", "ElasticConfig", "TrainConfig", "make_schedule"]


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the fix."""


def doc(default: Any, text: str, **kw) -> Any:
    """A dataclass field with a default and its documentation."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use tuples for sequence defaults (configs are frozen)")
    return field(default=default, metadata={"doc": text}, **kw)


# ----------------------------------------------------------------------------- type checks
def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp, key: str) -> Any:
    """Check ``value`` against annotation ``tp`` and return it in canonical form."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed and type(value) is type(allowed[allowed.index(value)]):
            return value
        raise ConfigError(f"{key}: expected one of {', '.join(map(repr, allowed))}, got {value!r}")
    if origin is tuple:
        (item_tp, *rest) = typing.get_args(tp)
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list of {_type_name(item_tp)}, got {value!r}")
        return tuple(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):
                raise ConfigError(f"{key}: must be a finite number, got {value!r}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"{key}: unsupported annotation {tp!r} in a config class")
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _unknown(key: str, name: str, cls) -> ConfigError:
    names = [f.name for f in fields(cls)]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown key {key!r}{hint}; {cls.__name__} has: {', '.join(names)}")


def from_dict(cls, data: Mapping[str, Any], prefix: str = ""):
    """Build config class ``cls`` from a mapping, checking every key and type."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or cls.__name__}: expected a mapping, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in fields(cls)}
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            raise _unknown(key, str(name), cls)
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix or cls.__name__}: {e}") from None


def to_dict(cfg) -> dict:
    """Plain dict (lists for tuples) of a config, for YAML/JSON dumps and checkpoints."""
    def conv(v):
        if is_dataclass(v):
            return {f.name: conv(getattr(v, f.name)) for f in fields(v)}
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        return v
    return conv(cfg)


def _parse_scalar(text: str) -> Any:
    import yaml  # PyYAML, imported only where configs are parsed

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse {text!r} as a YAML value: {e}") from None


def apply_overrides(cfg, overrides: Sequence[str]):
    """Apply ``key.path=value`` overrides (value in YAML syntax) with type checks."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value (e.g. optim.lr=1e-3)")
        path, text = item.split("=", 1)
        path = path.strip()
        cfg = _set_path(cfg, path.split("."), _parse_scalar(text), path)
    return cfg


def _set_path(cfg, parts: list[str], value: Any, full: str):
    name = parts[0]
    if not is_dataclass(cfg):
        raise ConfigError(f"{full}: {name!r} is not a section")
    if name not in {f.name for f in fields(cfg)}:
        raise _unknown(full, name, type(cfg))
    if len(parts) == 1:
        new = _coerce(value, _hints(type(cfg))[name], full)
    else:
        new = _set_path(getattr(cfg, name), parts[1:], value, full)
    try:
        return replace(cfg, **{name: new})
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{full}: {e}") from None


def load_config(cls, path: str | Path | None = None, overrides: Sequence[str] = ()):
    """Load ``cls`` from a YAML file (missing keys take their defaults), then apply overrides."""
    import yaml

    data: Mapping = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist; pass an existing YAML file")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
    base = cls()
    cfg = apply_overrides(overlay(base, data), overrides)
    check_applicable(cfg, base)
    return cfg


def overlay(cfg, data: Mapping[str, Any], prefix: str = ""):
    """``cfg`` with the keys of ``data`` (a recipe) replaced, and nothing else: a recipe that
    names ``train.seed`` changes the seed and keeps every other setting of ``cfg`` (the job's
    defaults), as ``--set train.seed=...`` does."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or type(cfg).__name__}: expected a mapping, got {data!r}")
    hints = _hints(type(cfg))
    names = {f.name for f in fields(cfg)}
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in names:
            raise _unknown(key, str(name), type(cfg))
        current = getattr(cfg, name)
        if is_dataclass(current) and isinstance(value, Mapping):
            kwargs[name] = overlay(current, value, key)
        else:
            kwargs[name] = _coerce(value, hints[name], key)
    try:
        return replace(cfg, **kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{prefix or type(cfg).__name__}: {e}") from None


# Which OptimConfig fields each optimizer reads (beside name, lr, lr_scaling, base_batch_size,
# max_grad_norm and exclude, which every one does).
OPTIM_FIELDS = {
    "sgd": {"momentum", "nesterov", "weight_decay"},
    "adamw": {"beta1", "beta2", "eps", "weight_decay"},
    "lamb": {"beta1", "beta2", "eps", "weight_decay", "bias_correction", "trust_ratio_on_excluded"},
    "nvlamb": {"beta1", "beta2", "eps", "weight_decay", "trust_ratio_on_excluded"},
    "lars": {"momentum", "weight_decay", "eta", "eps", "trust_ratio_on_excluded"},
}
_OPTIM_ALL = {"name", "lr", "lr_scaling", "base_batch_size", "max_grad_norm", "exclude"}


def check_applicable(cfg, base, prefix: str = "") -> None:
    """Refuse an optimizer setting that the chosen optimizer does not read (``optim.eta`` with
    lamb): compared with ``base`` (the job's defaults), every changed field must apply."""
    for f in fields(cfg):
        v, b = getattr(cfg, f.name), getattr(base, f.name)
        key = f"{prefix}{f.name}"
        if isinstance(v, OptimConfig):
            for g in fields(v):
                if g.name in _OPTIM_ALL or g.name in OPTIM_FIELDS[v.name]:
                    continue
                if getattr(v, g.name) != getattr(b, g.name):
                    users = sorted(n for n, used in OPTIM_FIELDS.items() if g.name in used)
                    raise ConfigError(f"{key}.{g.name}={getattr(v, g.name)!r} does not apply to {key}.name="
                                      f"{v.name!r} (it is read by {', '.join(users)}); remove it, or "
                                      f"choose one of those optimizers")
        elif is_dataclass(v):
            check_applicable(v, b, key + ".")


def explain(cls, prefix: str = "", instance=None) -> list[str]:
    """Lines ``key (type, default): doc`` for every field, nested sections included, with the
    defaults of ``instance`` (a job's config: ``cls()``) rather than of the section classes."""
    instance = cls() if instance is None else instance
    out = []
    hints = _hints(cls)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if is_dataclass(tp):
            out += explain(tp, key + ".", getattr(instance, f.name))
            continue
        default = getattr(instance, f.name)
        if isinstance(default, tuple):
            default = list(default)
        out.append(f"{key} ({_type_name(tp)}, default {default!r}): {f.metadata.get('doc', '')}")
    return out


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


# ----------------------------------------------------------------------------- sections
OptimName = Literal["sgd", "adamw", "lamb", "nvlamb", "lars"]


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer and its hyperparameters (names as in ``hvd_bert.core.optim``)."""

    name: OptimName = doc("lamb", "optimizer: sgd (momentum), adamw, lamb, nvlamb or lars")
    lr: float = doc(1e-3, "peak learning rate at base_batch_size (before lr_scaling)")
    lr_scaling: Literal["none", "linear", "sqrt"] = doc(
        "none", "scale lr from base_batch_size to the global batch: none, linear (Goyal) or sqrt")
    base_batch_size: int = doc(256, "the global batch at which lr was tuned (for lr_scaling)")
    weight_decay: float = doc(0.01, "decoupled weight decay (not applied to excluded parameters)")
    beta1: float = doc(0.9, "Adam/LAMB first-moment decay")
    beta2: float = doc(0.999, "Adam/LAMB second-moment decay")
    eps: float = doc(1e-6, "Adam/LAMB epsilon (outside the square root); LARS epsilon")
    momentum: float = doc(0.9, "SGD/LARS momentum")
    nesterov: bool = doc(False, "SGD: Nesterov momentum")
    eta: float = doc(1e-3, "LARS trust coefficient")
    bias_correction: bool = doc(True, "LAMB: Adam bias correction (always on for nvlamb)")
    max_grad_norm: Optional[float] = doc(
        None, "clip the global gradient norm to this (nvlamb: default 1.0); null = no clip")
    trust_ratio_on_excluded: Optional[bool] = doc(
        None, "whether excluded parameters still get the trust ratio; null = the optimizer's "
              "default (lamb: yes, as TF BERT and optax; nvlamb: no, as apex unless use_nvlamb; "
              "lars: no)")
    exclude: tuple[str, ...] = doc(
        BERT_EXCLUDE, "regular expressions of parameter names without weight decay (and layer "
                      "adaptation where configured); default BERT's")

    def __post_init__(self) -> None:
        _require(0 < self.lr < 1e4, f"optim.lr must be in (0, 1e4), got {self.lr}: no recipe steps that far "
                                    f"(LARS for ResNet peaks near 30)")
        _require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
                 f"optim.beta1/beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        _require(self.eps >= 0, f"optim.eps must be >= 0, got {self.eps}")
        _require(0 <= self.momentum < 1, f"optim.momentum must be in [0, 1), got {self.momentum}")
        _require(self.base_batch_size > 0, f"optim.base_batch_size must be > 0, got {self.base_batch_size}")
        _require(self.max_grad_norm is None or self.max_grad_norm > 0,
                 f"optim.max_grad_norm must be > 0 or null, got {self.max_grad_norm}")

    @property
    def effective_max_grad_norm(self) -> Optional[float]:
        if self.max_grad_norm is None and self.name == "nvlamb":
            return 1.0
        return self.max_grad_norm

    @property
    def effective_exclude(self) -> tuple[str, ...]:
        """LARS excludes normalisation layers too when the BERT default is left in place."""
        if self.name == "lars" and self.exclude == BERT_EXCLUDE:
            return LARS_EXCLUDE
        return self.exclude

    def peak_lr(self, global_batch_size: int) -> float:
        """``lr`` scaled to ``global_batch_size`` by ``lr_scaling``."""
        if self.lr_scaling == "linear":
            return S.linear_scaled_lr(self.lr, self.base_batch_size, global_batch_size)
        if self.lr_scaling == "sqrt":
            return S.sqrt_scaled_lr(self.lr, self.base_batch_size, global_batch_size)
        return self.lr

    def masks(self, names: Sequence[str]) -> tuple[list[bool], list[bool]]:
        """``(decay_mask, adapt_mask)`` for parameters called ``names``."""
        decay = name_mask(names, self.effective_exclude)
        on_excluded = self.trust_ratio_on_excluded
        if on_excluded is None:
            on_excluded = self.name == "lamb"
        adapt = [True] * len(decay) if on_excluded else list(decay)
        if self.name == "nvlamb" and not on_excluded and self.weight_decay == 0.0:
            adapt = [False] * len(decay)  # apex: the trust ratio follows wd != 0
        return decay, adapt

    def step_kwargs(self, names: Sequence[str]) -> dict:
        """Keyword arguments of ``hvd_bert.core.optim``'s step function (without ``lr``)."""
        decay, adapt = self.masks(names)
        if self.name == "sgd":
            return dict(momentum=self.momentum, weight_decay=self.weight_decay,
                        nesterov=self.nesterov, decay_mask=decay)
        if self.name == "adamw":
            return dict(beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                        weight_decay=self.weight_decay, decay_mask=decay)
        if self.name == "lars":
            return dict(momentum=self.momentum, weight_decay=self.weight_decay, eta=self.eta,
                        eps=self.eps, adapt_mask=adapt)
        kw = dict(beta1=self.beta1, beta2=self.beta2, eps=self.eps,
                  weight_decay=self.weight_decay, decay_mask=decay)
        if self.name == "nvlamb":
            return dict(kw, max_grad_norm=self.effective_max_grad_norm,
                        use_nvlamb=bool(self.trust_ratio_on_excluded))
        return dict(kw, bias_correction=self.bias_correction, adapt_mask=adapt,
                    max_grad_norm=self.max_grad_norm)


ScheduleName = Literal["constant", "linear_warmup", "poly_warmup", "warmup_poly_decay", "step"]


@dataclass(frozen=True)
class ScheduleConfig:
    """The learning-rate schedule; its peak is ``OptimConfig.peak_lr(global batch)``."""

    name: ScheduleName = doc(
        "poly_warmup", "constant; linear_warmup (then constant; Goyal when warmup_init_lr is "
                       "set); poly_warmup (BERT: warmup proportion, then (1-p)^power); "
                       "warmup_poly_decay (LARS: linear warmup, then polynomial decay to end_lr); "
                       "step (multiply by factor at each boundary)")
    total_steps: int = doc(1000, "optimizer steps in the run (the schedule's horizon)")
    warmup: float = doc(0.01, "poly_warmup: warmup as a proportion of total_steps")
    warmup_steps: int = doc(0, "linear_warmup / warmup_poly_decay: warmup length in steps")
    warmup_init_lr: float = doc(0.0, "linear_warmup: lr at step 0 (Goyal: the unscaled base lr)")
    power: float = doc(0.5, "poly_warmup / warmup_poly_decay: decay power (BERT NVIDIA 0.5, "
                            "Google 1.0, LARS 2.0)")
    end_lr: float = doc(0.0, "warmup_poly_decay: final lr")
    boundaries: tuple[int, ...] = doc((), "step: steps at which lr is multiplied by factor")
    factor: float = doc(0.1, "step: the multiplier")

    def __post_init__(self) -> None:
        _require(self.total_steps > 0, f"schedule.total_steps must be > 0, got {self.total_steps}")
        _require(0 <= self.warmup < 1, f"schedule.warmup is a proportion in [0, 1), got {self.warmup}")
        _require(self.warmup_steps >= 0, f"schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.name == "warmup_poly_decay":
            _require(self.warmup_steps < self.total_steps,
                     f"schedule.warmup_steps ({self.warmup_steps}) must be < total_steps "
                     f"({self.total_steps})")


def make_schedule(cfg: ScheduleConfig, peak_lr: float) -> S.Schedule:
    """The ``step -> lr`` function that ``cfg`` describes, peaking at ``peak_lr``."""
    if cfg.name == "constant":
        return S.Constant(peak_lr)
    if cfg.name == "linear_warmup":
        return S.LinearWarmup(peak_lr, cfg.warmup_steps, cfg.warmup_init_lr)
    if cfg.name == "poly_warmup":
        return S.PolyWarmupDecay(peak_lr, cfg.warmup, cfg.total_steps, cfg.power)
    if cfg.name == "warmup_poly_decay":
        return S.warmup_poly_decay(peak_lr, cfg.warmup_steps, cfg.total_steps, cfg.end_lr, cfg.power)
    if cfg.name == "step":
        return S.StepDecay(peak_lr, cfg.boundaries, cfg.factor)
    raise ConfigError(f"schedule.name: unknown schedule {cfg.name!r}")


@dataclass(frozen=True)
class BatchConfig:
    """Batch layout; give local_batch_size and backward_passes_per_step, or the global batch
    and one of them (the other is derived; inconsistent values are an error)."""

    local_batch_size: Optional[int] = doc(32, "examples in one micro-batch on one rank")
    backward_passes_per_step: Optional[int] = doc(
        None, "micro-batches accumulated before each allreduce and optimizer step "
              "(Horovod's name; null = derived, or 1)")
    global_batch_size: Optional[int] = doc(
        None, "examples per optimizer step over all ranks; null = derived")

    def plan(self, world_size: int) -> BatchPlan:
        try:
            return plan_batch(world_size=world_size, local_batch_size=self.local_batch_size,
                              backward_passes_per_step=self.backward_passes_per_step,
                              global_batch_size=self.global_batch_size)
        except ValueError as e:
            raise ConfigError(f"batch: {e}") from None


@dataclass(frozen=True)
class PrecisionConfig:
    """Mixed precision and dynamic loss scaling (GradScaler's defaults)."""

    mode: Literal["fp32", "fp16", "bf16"] = doc(
        "fp32", "fp32, fp16 (autocast + dynamic loss scaling) or bf16 (autocast, no scaling)")
    init_scale: float = doc(65536.0, "initial loss scale (fp16)")
    growth_factor: float = doc(2.0, "scale multiplier after growth_interval clean steps")
    backoff_factor: float = doc(0.5, "scale multiplier on an overflow (the step is skipped)")
    growth_interval: int = doc(2000, "clean steps before the scale grows")

    def __post_init__(self) -> None:
        _require(self.init_scale > 0, f"precision.init_scale must be > 0, got {self.init_scale}")
        _require(self.growth_factor > 1, f"precision.growth_factor must be > 1, got {self.growth_factor}")
        _require(0 < self.backoff_factor < 1,
                 f"precision.backoff_factor must be in (0, 1), got {self.backoff_factor}")
        _require(self.growth_interval > 0,
                 f"precision.growth_interval must be > 0, got {self.growth_interval}")


@dataclass(frozen=True)
class ElasticConfig:
    """What a run launched by Horovod elastic (``horovodrun --min-np/--max-np
    --host-discovery-script``) does when workers are lost or added: the global batch and the LR
    schedule stay as configured; ``backward_passes_per_step`` (and, where needed, the local
    batch) is recomputed from the new world size."""

    uneven: Literal["nearest", "wait"] = doc(
        "nearest", "when the new world size cannot make the global batch exactly: nearest (train on "
                   "the nearest global batch, peak LR rescaled by optim.lr_scaling) or wait (train "
                   "nothing until workers are added or removed)")
    commit_every: int = doc(1, "optimizer steps between commits of the training state to memory "
                               "(what a lost worker rolls back to)")
    wait_poll_s: float = doc(1.0, "seconds between checks for new workers while waiting (uneven=wait)")

    def __post_init__(self) -> None:
        _require(self.commit_every > 0, f"elastic.commit_every must be > 0, got {self.commit_every}")
        _require(self.wait_poll_s > 0, f"elastic.wait_poll_s must be > 0, got {self.wait_poll_s}")


@dataclass(frozen=True)
class HorovodConfig:
    """How gradients are reduced across ranks."""

    compression: Literal["none", "fp16"] = doc(
        "none", "allreduce wire format: none, or fp16 (halves the bytes, no scaling)")
    gradient_predivide_factor: float = doc(
        1.0, "divide gradients by this before the sum and by size/this after it")
    fusion_threshold_mb: Optional[int] = doc(
        None, "HOROVOD_FUSION_THRESHOLD in MiB (Horovod's default 128); null = leave as is")
    cycle_time_ms: Optional[float] = doc(
        None, "HOROVOD_CYCLE_TIME in ms (Horovod's default 1); null = 5 on a CPU (measured faster, "
              "BENCHMARKS.md), Horovod's 1 with NCCL or under Horovod elastic")
    cpu_operations: Optional[Literal["gloo", "mpi"]] = doc(
        None, "HOROVOD_CPU_OPERATIONS: the CPU allreduce library, gloo or mpi (mpi needs mpirun); "
              "null = Horovod's choice for the launcher (mpi under mpirun/srun, with OpenMPI yielding "
              "while it waits, on a CPU outside Horovod elastic)")
    hierarchical_allreduce: Optional[bool] = doc(
        None, "HOROVOD_HIERARCHICAL_ALLREDUCE: reduce within each node, then across nodes; "
              "null = leave as is")
    autotune: bool = doc(False, "HOROVOD_AUTOTUNE: let Horovod tune fusion and cycle time while training")
    autotune_log: str = doc("", "HOROVOD_AUTOTUNE_LOG: the CSV file where rank 0 logs what autotune tried")
    timeline: str = doc("", "HOROVOD_TIMELINE: the file where rank 0 writes Horovod's timeline of the run "
                            "(chrome://tracing); empty = none")

    def __post_init__(self) -> None:
        _require(self.gradient_predivide_factor > 0,
                 f"horovod.gradient_predivide_factor must be > 0, got {self.gradient_predivide_factor}")
        _require(not self.autotune_log or self.autotune,
                 "horovod.autotune_log is set but horovod.autotune is false: set horovod.autotune=true")


@dataclass(frozen=True)
class TrainConfig:
    """A training run's engine settings, shared by both frameworks."""

    optim: OptimConfig = doc(OptimConfig(), "")
    schedule: ScheduleConfig = doc(ScheduleConfig(), "")
    batch: BatchConfig = doc(BatchConfig(), "")
    precision: PrecisionConfig = doc(PrecisionConfig(), "")
    horovod: HorovodConfig = doc(HorovodConfig(), "")
    elastic: ElasticConfig = doc(ElasticConfig(), "")
    seed: int = doc(0, "random seed (model init, data order, masking)")
    log_every: int = doc(10, "log every this many optimizer steps (rank 0)")
    checkpoint_every: int = doc(0, "checkpoint every this many optimizer steps (0 = at the end only)")
    keep_checkpoints: int = doc(3, "newest checkpoints to keep")
    output_dir: str = doc("runs/latest", "folder for checkpoints and logs (jobs: empty means "
                                         "runs/<job>-<framework>-<data folder name>)")
    resume_resized: bool = doc(False, "resume a checkpoint written by another number of ranks (same "
                                      "global batch; each rank's data share and RNG stream change)")
    max_skipped_steps: int = doc(
        50, "stop with an error after this many optimizer steps in a row were skipped for inf/NaN "
            "gradients (a diverged run: lower optim.lr, or use fp32)")

    def __post_init__(self) -> None:
        _require(self.max_skipped_steps > 0, f"max_skipped_steps must be > 0, got {self.max_skipped_steps}")
        _require(self.log_every > 0, f"log_every must be > 0, got {self.log_every}")
        _require(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        _require(self.keep_checkpoints > 0, f"keep_checkpoints must be > 0, got {self.keep_checkpoints}")


@dataclass(frozen=True)
class PretrainConfig:
    """BERT pretraining: the engine settings plus model and data. Defaults: a tiny BERT on the
    built-in corpus with NVLAMB and BERT's polynomial warmup (NVIDIA's recipe shape)."""

    train: TrainConfig = doc(TrainConfig(
        optim=OptimConfig(name="nvlamb", lr=5e-3, weight_decay=0.01),
        schedule=ScheduleConfig(name="poly_warmup", warmup=0.1, total_steps=200, power=0.5),
        batch=BatchConfig(local_batch_size=32, backward_passes_per_step=2),
        checkpoint_every=50, output_dir=""), "")
    model: Literal["tiny", "mini", "small", "base", "large"] = doc("tiny", "BERT size preset")
    data: str = doc("", "prepared pretraining folder (hvd-bert prepare-bert); empty: the built-in "
                        "corpus prepared under the cache folder")
    max_seq_length: int = doc(128, "sequence length the data was prepared with (phase 1: 128, 2: 512)")
    max_predictions_per_seq: int = doc(20, "masked positions per sequence in the data")
    shuffle_buffer: int = doc(1024, "records per shuffle window of the reader")
    record_striding: bool = doc(False, "every rank reads every shard and keeps every world_size-th "
                                       "record (automatic when there are fewer shards than ranks)")
    dropout: float = doc(0.1, "BERT's hidden and attention dropout (a probability in [0, 1))")
    init_checkpoint: str = doc("", "phase 2: start from this phase-1 checkpoint's weights with a "
                                   "fresh optimizer and schedule")
    eval_data: str = doc("", "held-out prepared pretraining folder (same vocab and lengths), scored at "
                             "the end and every eval_every steps: masked-LM loss and accuracy, NSP "
                             "accuracy; empty: none")
    eval_every: int = doc(0, "also evaluate eval_data every this many steps (0: at the end only)")
    eval_batch_size: int = doc(64, "sequences per evaluation batch on one rank")
    progress: bool = doc(True, "show a progress bar on rank 0")
    framework: Literal["pt", "tf"] = doc("pt", "pt (PyTorch) or tf (TensorFlow); also --framework")

    def __post_init__(self) -> None:
        _require(0 <= self.dropout < 1, f"dropout is a probability in [0, 1), got {self.dropout}")
        _require(self.eval_every >= 0 and self.eval_batch_size > 0,
                 "eval_every must be >= 0 and eval_batch_size > 0")
        _require(self.max_seq_length > 0 and self.max_predictions_per_seq > 0,
                 "max_seq_length and max_predictions_per_seq must be > 0")


@dataclass(frozen=True)
class FinetuneConfig:
    """BERT fine-tuning from a pretrained checkpoint (Google's run_classifier / run_squad
    recipe: AdamW, linear warmup and decay, a few epochs): sentence(-pair) classification,
    regression (STS-B) or SQuAD, as the prepared data says."""

    train: TrainConfig = doc(TrainConfig(
        optim=OptimConfig(name="adamw", lr=5e-5, weight_decay=0.01),
        schedule=ScheduleConfig(name="poly_warmup", warmup=0.1, total_steps=1000, power=1.0),
        batch=BatchConfig(local_batch_size=32, backward_passes_per_step=1),
        log_every=10, checkpoint_every=0, output_dir=""), "")
    data: str = doc("", "training set prepared by hvd-bert prepare-classification or prepare-squad "
                        "(required)")
    eval_data: str = doc("", "evaluation set (prepared with the training set's --labels; for SQuAD a dev "
                             "file prepared with --split dev); empty: none")
    task: str = doc("", "what the data must be: squad, classification, regression or a GLUE task name; "
                        "empty: whatever the prepared data is (also --task)")
    init_checkpoint: str = doc("", "pretrained weights: a run folder, ckpt-*.pt / ckpt-*.tf, or a .npz "
                                   "(hvd-bert convert); empty: train from BERT's initialisation")
    model: Literal["tiny", "mini", "small", "base", "large"] = doc(
        "tiny", "BERT size preset when init_checkpoint does not say (a .npz or a run folder does)")
    epochs: float = doc(3.0, "passes over the training set; sets train.schedule.total_steps "
                             "(0: use train.schedule.total_steps)")
    do_train: bool = doc(True, "false: only evaluate eval_data (SQuAD: write predictions) with "
                               "init_checkpoint, e.g. a fine-tuned run folder")
    eval_every: int = doc(0, "also evaluate every this many steps (0: at the end only)")
    eval_batch_size: int = doc(64, "examples per evaluation batch on one rank")
    dropout: float = doc(0.1, "BERT's hidden and attention dropout")
    length_grouping: int = doc(32, "pad each batch to its longest sequence, after sorting every this many "
                                   "batches of a rank by length (1: no sorting; 0: pad to max_seq_length)")
    n_best_size: int = doc(20, "SQuAD: candidate answers kept per question (nbest_predictions.json)")
    max_answer_length: int = doc(30, "SQuAD: the longest answer in WordPiece tokens")
    null_score_diff_threshold: float = doc(0.0, "SQuAD v2.0: predict no answer above this null-score margin")
    shuffle_buffer: int = doc(1024, "records per shuffle window of the reader")
    progress: bool = doc(True, "show a progress bar on rank 0")
    framework: Literal["pt", "tf"] = doc("pt", "pt (PyTorch) or tf (TensorFlow); also --framework")

    def __post_init__(self) -> None:
        _require(self.epochs >= 0, f"epochs must be >= 0, got {self.epochs}")
        _require(0 <= self.dropout < 1, f"dropout is a probability in [0, 1), got {self.dropout}")
        _require(self.eval_batch_size > 0, f"eval_batch_size must be > 0, got {self.eval_batch_size}")
        _require(self.length_grouping >= 0, f"length_grouping must be >= 0, got {self.length_grouping}")
        _require(self.n_best_size > 0 and self.max_answer_length > 0,
                 "n_best_size and max_answer_length must be > 0")
