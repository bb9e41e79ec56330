"""The small model, data and losses shared by the PyTorch engine workers and the
single-process reference (no Horovod in this module)."""

from collections import OrderedDict

import torch

from hvd_bert.config import TrainConfig, apply_overrides

from toy_data import IN, HID, OUT, N_ROWS, global_rows as _rows, overrides  # noqa: F401
import toy_data

LR = toy_data.LR


def make_model(seed: int = 0, dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(OrderedDict(
        dense_in=torch.nn.Linear(IN, HID), act=torch.nn.Tanh(), LayerNorm=torch.nn.LayerNorm(HID),
        drop=torch.nn.Dropout(dropout), dense_out=torch.nn.Linear(HID, OUT)))


def dataset(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = toy_data.dataset(seed)
    return torch.from_numpy(x), torch.from_numpy(y)


def global_rows(step: int, global_batch: int) -> torch.Tensor:
    return torch.from_numpy(_rows(step, global_batch))


def micro_batches(rank: int, world: int, local_b: int, k: int, start_micro: int = 0):
    """Rank ``rank``'s micro-batches from micro-step ``start_micro`` on: its contiguous share
    of each global batch, cut into k micro-batches of ``local_b`` rows."""
    x, y = dataset()
    m = start_micro
    while True:
        rows = torch.from_numpy(toy_data.rank_rows(rank, world, local_b, k, m))
        yield x[rows], y[rows]
        m += 1


def mse(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).float(), y)


def config(optim: str, local_b: int, k: int, steps: int, *extra: str) -> TrainConfig:
    return apply_overrides(TrainConfig(), overrides(optim, local_b, k, steps, *extra))


def flat_params(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().tolist()


def reference_run(optim: str, world: int, local_b: int, k: int, steps: int) -> list[float]:
    """One process, one batch of world*local_b*k rows per step, plain torch loop."""
    from hvd_bert.core.schedules import make_schedule
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
