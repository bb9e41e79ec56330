"""The small model, data and losses shared by the PyTorch engine workers and the
single-process reference (no Horovod in this module)."""

from collections import OrderedDict

import numpy as np
import torch

from hvd_bert.common.config import TrainConfig, apply_overrides

N_ROWS = 512
IN, HID, OUT = 8, 16, 4


def make_model(seed: int = 0, dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(OrderedDict(
        dense_in=torch.nn.Linear(IN, HID), act=torch.nn.Tanh(), LayerNorm=torch.nn.LayerNorm(HID),
        drop=torch.nn.Dropout(dropout), dense_out=torch.nn.Linear(HID, OUT)))


def dataset(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N_ROWS, IN)).astype(np.float32)
    w = rng.normal(size=(IN, OUT)).astype(np.float32)
    y = np.tanh(x @ w) + 0.1 * rng.normal(size=(N_ROWS, OUT)).astype(np.float32)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.float32))


def global_rows(step: int, global_batch: int) -> torch.Tensor:
    """Row indices of optimizer step ``step`` (0-based): consecutive, wrapping around."""
    return torch.arange(step * global_batch, (step + 1) * global_batch) % N_ROWS


def micro_batches(rank: int, world: int, local_b: int, k: int, start_micro: int = 0):
    """Rank ``rank``'s micro-batches from micro-step ``start_micro`` on: its contiguous share
    of each global batch, cut into k micro-batches of ``local_b`` rows."""
    x, y = dataset()
    g = world * local_b * k
    m = start_micro
    while True:
        step, i = divmod(m, k)
        rows = global_rows(step, g)[rank * local_b * k + i * local_b:][:local_b]
        yield x[rows], y[rows]
        m += 1


def mse(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).float(), y)


LR = {"sgd": 0.05, "lamb": 0.02, "nvlamb": 0.02, "lars": 2.0, "adamw": 0.01}


def config(optim: str, local_b: int, k: int, steps: int, *extra: str) -> TrainConfig:
    return apply_overrides(TrainConfig(), [
        f"optim.name={optim}", f"optim.lr={LR[optim]}", "optim.weight_decay=0.01",
        f"batch.local_batch_size={local_b}", f"batch.backward_passes_per_step={k}",
        "schedule.name=poly_warmup", "schedule.warmup=0.2", f"schedule.total_steps={steps}",
        *extra])


def flat_params(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().tolist()


def reference_run(optim: str, world: int, local_b: int, k: int, steps: int) -> list[float]:
    """One process, one batch of world*local_b*k rows per step, plain torch loop."""
    from hvd_bert.common.config import make_schedule
    from hvd_bert.pt.optim import build_optimizer

    cfg = config(optim, local_b, k, steps)
    g = world * local_b * k
    model = make_model()
    peak = cfg.optim.peak_lr(g)
    opt = build_optimizer(model.named_parameters(), cfg.optim, lr=peak)
    sched = make_schedule(cfg.schedule, peak)
    x, y = dataset()
    for s in range(steps):
        rows = global_rows(s, g)
        opt.zero_grad()
        mse(model, (x[rows], y[rows])).backward()
        for group in opt.param_groups:
            group["lr"] = sched(s + 1)
        opt.step()
    return flat_params(model)
