"""The sections of a training run's configuration, shared by every job and both frameworks:
the optimizer, the LR schedule, the batch layout, precision, Horovod and elastic settings,
and :class:`TrainConfig` that holds them."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import ClassVar, Literal, Optional, Sequence

from hvd_bert.config.base import ConfigError, doc, require
from hvd_bert.core import schedules as S
from hvd_bert.core.batch import BatchPlan, plan_batch
from hvd_bert.core.optim import BERT_EXCLUDE, LARS_EXCLUDE, name_mask

__all__ = ["OptimConfig", "ScheduleConfig", "BatchConfig", "PrecisionConfig", "HorovodConfig",
           "ElasticConfig", "ZeroConfig", "TrainConfig", "OPTIM_FIELDS", "activation_policy"]

SEED_MAX = 2**31 - 1  # (a seed plus any rank stays below 2**32)

# Which OptimConfig fields each optimizer reads (beside name, lr, lr_scaling, base_batch_size,
# max_grad_norm and exclude, which every one does).
OPTIM_FIELDS = {
    "sgd": {"momentum", "nesterov", "weight_decay"},
    "adamw": {"beta1", "beta2", "eps", "weight_decay"},
    "lamb": {"beta1", "beta2", "eps", "weight_decay", "bias_correction", "trust_ratio_on_excluded"},
    "nvlamb": {"beta1", "beta2", "eps", "weight_decay", "trust_ratio_on_excluded"},
    "lars": {"momentum", "weight_decay", "eta", "eps", "trust_ratio_on_excluded"},
    "lion": {"beta1", "beta2", "weight_decay"},
}
_OPTIM_ALL = {"name", "lr", "lr_scaling", "base_batch_size", "max_grad_norm", "exclude"}


OptimName = Literal["sgd", "adamw", "lamb", "nvlamb", "lars", "lion"]


def regex_error(pattern) -> str | None:
    """Why ``pattern`` is not a regular expression Python compiles; None when it is."""
    import re

    try:
        re.compile(pattern)
    except (re.error, TypeError, RecursionError, OverflowError) as e:
        return str(e) or type(e).__name__
    return None


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer and its hyperparameters (names as in ``hvd_bert.core.optim``)."""

    name: OptimName = doc("lamb", "optimizer: sgd (momentum), adamw, lamb, nvlamb, lars or lion")
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
        require(0 < self.lr < 1e4, f"train.optim.lr must be in (0, 1e4), got {self.lr}: no recipe steps that "
                                   f"far "
                                    f"(LARS for ResNet peaks near 30)")
        require(0 <= self.weight_decay <= 10, f"train.optim.weight_decay must be in [0, 10], got "
                                              f"{self.weight_decay} (BERT's 0.01)")
        require(0 < self.eta <= 1e3, f"train.optim.eta must be in (0, 1e3], got {self.eta}: LARS's trust "
                                     f"coefficient (0.001)")
        require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
                 f"train.optim.beta1/beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        require(0 < self.eps < 1, f"train.optim.eps must be in (0, 1), got {self.eps}: it keeps the "
                                  f"update's denominator off zero (BERT's 1e-6)")
        require(0 <= self.momentum < 1, f"train.optim.momentum must be in [0, 1), got {self.momentum}")
        require(self.base_batch_size > 0,
                f"train.optim.base_batch_size must be > 0, got {self.base_batch_size}")
        require(self.max_grad_norm is None or self.max_grad_norm > 0,
                 f"train.optim.max_grad_norm must be > 0 or null, got {self.max_grad_norm}")
        for pattern in self.exclude:
            bad = regex_error(pattern)
            require(bad is None, f"train.optim.exclude: {pattern!r} is not a regular expression ({bad}); "
                                 f"give Python regular expressions of parameter names, e.g. ['bias', "
                                 f"'LayerNorm']")

    def check_against(self, base: OptimConfig, key: str) -> None:
        """Refuse a setting the chosen optimizer does not read (``train.optim.eta`` with lamb): every
        field changed from ``base`` (the job's default) must apply to ``name``."""
        for g in fields(self):
            if g.name in _OPTIM_ALL or g.name in OPTIM_FIELDS[self.name]:
                continue
            if getattr(self, g.name) != getattr(base, g.name):
                users = sorted(n for n, used in OPTIM_FIELDS.items() if g.name in used)
                raise ConfigError(f"{key}.{g.name}={getattr(self, g.name)!r} does not apply to {key}.name="
                                  f"{self.name!r} (it is read by {', '.join(users)}); remove it, or "
                                  f"choose one of those optimizers")

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
        if self.name == "lion":
            return dict(beta1=self.beta1, beta2=self.beta2, weight_decay=self.weight_decay, decay_mask=decay)
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
        require(self.total_steps > 0, f"train.schedule.total_steps must be > 0, got {self.total_steps}")
        require(0 <= self.warmup < 1, f"train.schedule.warmup is a proportion in [0, 1), got {self.warmup}")
        require(self.warmup_steps >= 0, f"train.schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        require(self.power > 0, f"train.schedule.power must be > 0 (a decay: the LR never rises past its "
                                f"peak), got {self.power}")
        require(0 <= self.end_lr < 1e4 and 0 <= self.warmup_init_lr < 1e4,
                f"train.schedule.end_lr and warmup_init_lr must be in [0, 1e4), got {self.end_lr}, "
                f"{self.warmup_init_lr}")
        require(0 < self.factor <= 1, f"train.schedule.factor must be in (0, 1], got {self.factor}: the step "
                                      f"schedule's multiplier at each boundary (a decay: the LR never rises "
                                      f"past its peak)")
        b = list(self.boundaries)
        require(all(x >= 1 for x in b) and all(x < y for x, y in zip(b, b[1:])),
                f"train.schedule.boundaries must be steps from 1 up, strictly increasing, got {b}")
        if self.name == "warmup_poly_decay":
            require(self.warmup_steps < self.total_steps,
                     f"train.schedule.warmup_steps ({self.warmup_steps}) must be < total_steps "
                     f"({self.total_steps})")


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
                              global_batch_size=self.global_batch_size,
                              largest_local=type(self)().local_batch_size)  # (the global batch alone)
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
    weights: Literal["fp32", "bf16"] = doc(
        "fp32", "the model's weights and gradients: fp32, or bf16 over fp32 master weights kept with the "
                "optimizer state and split with it under ZeRO (PyTorch; needs mode=bf16)")

    def __post_init__(self) -> None:
        require(self.weights == "fp32" or self.mode == "bf16",
                f"train.precision.weights=bf16 needs train.precision.mode=bf16 (the forward pass in bf16), "
                f"got mode={self.mode}: set train.precision.mode=bf16, or weights=fp32")
        require(1 <= self.init_scale <= 2.0 ** 64,
                f"train.precision.init_scale must be in [1, 2^64], got {self.init_scale} "
                f"(GradScaler's 65536; below 1 it would shrink the fp16 gradients it exists to lift)")
        require(1 < self.growth_factor <= 1e3,
                f"train.precision.growth_factor must be in (1, 1e3], got {self.growth_factor}")
        require(0 < self.backoff_factor < 1,
                 f"train.precision.backoff_factor must be in (0, 1), got {self.backoff_factor}")
        require(self.growth_interval > 0,
                 f"train.precision.growth_interval must be > 0, got {self.growth_interval}")


@dataclass(frozen=True)
class ElasticConfig:
    """What a run launched by Horovod elastic (``horovodrun --min-np/--max-np
    --host-discovery-script``) does when workers are lost or added: the global batch and the LR
    schedule stay as configured; ``backward_passes_per_step`` (and, where needed, the local
    batch) is recomputed from the new world size."""

    uneven: Literal["nearest", "wait"] = doc(
        "nearest", "when the new world size cannot make the global batch exactly: nearest (train on "
                   "the nearest global batch, peak LR rescaled by train.optim.lr_scaling) or wait (train "
                   "nothing until workers are added or removed)")
    commit_every: int = doc(1, "optimizer steps between commits of the training state to memory "
                               "(what a lost worker rolls back to)")
    wait_poll_s: float = doc(1.0, "seconds between checks for new workers while waiting (uneven=wait)")

    def __post_init__(self) -> None:
        require(self.commit_every > 0, f"train.elastic.commit_every must be > 0, got {self.commit_every}")
        require(self.wait_poll_s > 0, f"train.elastic.wait_poll_s must be > 0, got {self.wait_poll_s}")


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
        require(1 <= self.gradient_predivide_factor <= 1e6,
                 f"train.horovod.gradient_predivide_factor must be in [1, 1e6], got "
                 f"{self.gradient_predivide_factor}: the part of the average taken before the sum (1: all "
                 f"of it after; the world size: all of it before)")
        require(not self.autotune_log or self.autotune,
                 "train.horovod.autotune_log is set but train.horovod.autotune is false: set "
                 "train.horovod.autotune=true")
        require(self.fusion_threshold_mb is None or 0 <= self.fusion_threshold_mb <= 1 << 20,
                f"train.horovod.fusion_threshold_mb must be from 0 (no fusion) to 1048576 MiB, got "
                f"{self.fusion_threshold_mb}")
        require(self.cycle_time_ms is None or 0 < self.cycle_time_ms <= 60_000,
                f"train.horovod.cycle_time_ms must be more than 0 and at most 60000, got "
                f"{self.cycle_time_ms}")


@dataclass(frozen=True)
class ZeroConfig:
    """ZeRO (Rajbhandari et al. 2020): optimizer state, and at stage 2 gradients too, split over
    the data-parallel ranks; every rank still holds the whole model. Same training as stage 0 to
    round-off, the same checkpoints (written consolidated, resumable at any stage and world size)."""

    stage: Literal[0, 1, 2] = doc(
        0, "0: every rank holds all optimizer state; 1: each rank holds and updates 1/N of it (the "
           "gradients allreduced as at 0, the updated weights allgathered); 2: the gradients too are "
           "1/N, reduce-scattered after every micro-batch")
    bucket_mb: float = doc(32.0, "MiB of gradients or weights per reduce-scatter/allgather call of a ZeRO "
                                 "step (4 in flight, which Horovod fuses: about what a step holds beyond "
                                 "its shards)")

    def __post_init__(self) -> None:
        require(self.stage in (0, 1, 2), f"train.zero.stage must be 0, 1 or 2, got {self.stage}")
        require(self.bucket_mb > 0, f"train.zero.bucket_mb must be > 0, got {self.bucket_mb}")


def activation_policy(text: str) -> tuple[int, bool]:
    """``train.activation_checkpointing`` as ``(every, attention)``: recompute every ``every``-th
    encoder layer whole (0: none), or each layer's attention block (``attention``)."""
    if text == "off":
        return 0, False
    if text == "attention":
        return 0, True
    name, _, k = text.partition(":")
    if name == "layers" and (not k or (k.isdigit() and 1 <= int(k) <= 1 << 16)):
        return int(k or 1), False
    raise ConfigError(f"train.activation_checkpointing={text!r}: give off, layers, layers:K (K >= 1: every "
                      f"K-th encoder layer) or attention")


@dataclass(frozen=True)
class TrainConfig:
    """A training run's engine settings, shared by both frameworks. Every job holds one as its
    ``train`` section, and the settings have the same names everywhere: ``train.optim.lr`` on
    the command line, in a recipe and in ``apply_overrides(TrainConfig(), [...])`` (which also
    takes them without ``train.``); ``load_config(TrainConfig, recipe)`` reads a job recipe's
    ``train:`` section."""

    JOB_SECTION: ClassVar[str] = "train"  # its name in every job's config

    optim: OptimConfig = doc(OptimConfig(), "")
    schedule: ScheduleConfig = doc(ScheduleConfig(), "")
    batch: BatchConfig = doc(BatchConfig(), "")
    precision: PrecisionConfig = doc(PrecisionConfig(), "")
    horovod: HorovodConfig = doc(HorovodConfig(), "")
    elastic: ElasticConfig = doc(ElasticConfig(), "")
    zero: ZeroConfig = doc(ZeroConfig(), "")
    tensor_parallel: int = doc(1, "ranks (of one node) that split each BERT layer's heads and MLP between "
                                  "them, Megatron-style (PyTorch pretraining); 1 = none. It divides the "
                                  "world size, the heads and the intermediate size; the global batch is "
                                  "over world size / tensor_parallel replicas")
    activation_checkpointing: str = doc(
        "off", "recompute activations in the backward pass instead of keeping them (less memory, about "
               "one more forward pass of time): off; layers (every encoder layer keeps only its input); "
               "layers:K (every K-th layer); attention (each layer's attention block: its S x S scores). "
               "Gradients are those of off (dropout draws the same masks again); PyTorch only")
    host_reads: Literal["step", "log"] = doc(
        "step", "when the loop reads a step's outcome (applied or skipped, gradient norm, loss scale, "
                "metrics) to the host: step (after every optimizer step: exact counts, LR and bias "
                "corrections) or log (PyTorch: only when it logs, saves, evaluates, stops or may have "
                "diverged, in one transfer, so the device's queue never drains between; a step skipped "
                "inside such a window is counted at its end, and the steps after it in the window take "
                "the LR and bias correction one step ahead)")
    seed: int = doc(0, "random seed (model init, data order, masking)")
    log_every: int = doc(10, "log every this many optimizer steps (rank 0)")
    checkpoint_every: int = doc(0, "checkpoint every this many optimizer steps (0 = at the end only)")
    keep_checkpoints: int = doc(3, "newest checkpoints to keep")
    checkpoint_format: Literal["auto", "consolidated", "sharded"] = doc(
        "auto", "auto: sharded wherever the job has more than one rank (or runs under Horovod elastic), "
                "consolidated on one; consolidated: one file (ckpt-N.pt; TensorFlow: a folder ckpt-N.tf) "
                "that rank 0 writes from every rank's state; sharded: a folder ckpt-N.shards, the same in "
                "both frameworks, in which every rank writes its own share in the background, complete "
                "once its index.json is written, resumable under another world size, ZeRO stage or "
                "tensor_parallel (it needs a folder every rank sees). Either kind resumes the other's run")
    output_dir: str = doc("runs/latest", "folder for checkpoints and logs (jobs: empty means "
                                         "runs/<job>-<framework>-<data folder name>)")
    resume_resized: bool = doc(True, "resume a checkpoint written by another number of data-parallel "
                                     "replicas (the same global batch; each rank's data share and RNG stream "
                                     "change); false: refuse, for a run that must repeat its ranks' streams")
    resume_unchecked: bool = doc(False, "resume a run folder's checkpoints although its config.json is "
                                        "missing or damaged (the settings given now are not compared)")
    check_memory: bool = doc(True, "pretraining: refuse to start (one line, exit 2) when the training "
                                   "state the ranks on a host (or a GPU) will hold exceeds its available "
                                   "memory, as the memory plan line computes it before anything is built")
    max_skipped_steps: int = doc(
        50, "stop with an error after this many optimizer steps in a row were skipped for inf/NaN "
            "gradients (a diverged run: lower train.optim.lr, or use fp32)")

    report_to: tuple[Literal["tensorboard", "mlflow", "wandb"], ...] = doc(
        ("tensorboard",), "where rank 0 reports the run besides metrics.jsonl: tensorboard (tensorboard/ in "
                          "the run folder), mlflow (MLFLOW_TRACKING_URI, else sqlite in the run folder: "
                          "parameters, per-step metrics, the best model as an artifact) and/or wandb (a "
                          "Weights & Biases run in the run folder's wandb/, offline unless WANDB_MODE says "
                          "otherwise); [] for none")
    stall_timeout_s: float = doc(
        600.0, "stop the job (exit status 5, one line naming the rank and what it was doing) when a rank "
               "makes no progress for this many seconds, or for 20 times its slowest step so far if that "
               "is longer (a stuck collective, data read or file system); 0: never")

    def __post_init__(self) -> None:
        require(0 <= self.seed <= SEED_MAX, f"train.seed must be in [0, {SEED_MAX}], got {self.seed}: numpy "
                f"and TensorFlow take seeds below 2**32, and each rank adds its rank to it")
        require(self.stall_timeout_s == 0 or self.stall_timeout_s >= 1,
                f"stall_timeout_s must be 0 (never) or at least 1 second, got {self.stall_timeout_s}")
        require(self.tensor_parallel >= 1, f"tensor_parallel must be >= 1, got {self.tensor_parallel}")
        require(self.tensor_parallel == 1 or self.precision.weights == "fp32",
                "train.precision.weights=bf16 does not run under train.tensor_parallel > 1 yet: set "
                "train.precision.weights=fp32 or train.tensor_parallel=1")
        activation_policy(self.activation_checkpointing)  # (a ConfigError naming the choices)
        require(self.max_skipped_steps > 0, f"max_skipped_steps must be > 0, got {self.max_skipped_steps}")
        require(self.log_every > 0, f"log_every must be > 0, got {self.log_every}")
        require(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        require(self.keep_checkpoints > 0, f"keep_checkpoints must be > 0, got {self.keep_checkpoints}")

    def resolve_given(self, given: set[str], prefix: str = "") -> TrainConfig:
        """A global batch the user gave is reached by deriving what the user did not give: the
        default ``backward_passes_per_step`` (or, when that was given, the local batch). Only
        three given values that disagree are an error."""
        g, loc, k = (f"{prefix}batch.{n}" in given
                     for n in ("global_batch_size", "local_batch_size", "backward_passes_per_step"))
        b = self.batch
        if not g:
            return self
        if not loc and not k:  # the global batch alone: the local batch and k both derived (plan_batch)
            return replace(self, batch=replace(b, local_batch_size=None, backward_passes_per_step=None))
        if not k and b.backward_passes_per_step is not None and (loc or b.local_batch_size is not None):
            return replace(self, batch=replace(b, backward_passes_per_step=None))
        if k and not loc and b.local_batch_size is not None:
            return replace(self, batch=replace(b, local_batch_size=None))
        return self
