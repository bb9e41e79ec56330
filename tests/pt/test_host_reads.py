"""The PyTorch step keeps its decisions on the device: over several optimizer steps of
micro-batches, the reduction, the global norm and clip, the update, the loss-scale update and
the decision to skip a non-finite step read no tensor to the host (``item``, ``__float__``,
``__bool__``, ``__int__``, ``__index__``, ``tolist``, ``numpy``, ``cpu``), for NVLAMB, LAMB and
AdamW at ZeRO stages 0, 1 and 2 with accumulation, fp16 loss scaling and clipping on; each
step's outcome and metrics then come to the host in one read (``finish_step``). A step with an
inf in its gradients is skipped on the device: nothing changes. The fused C kernels of the CPU
(which read their coefficients from host memory, where the tensors are) are off here: this is
the path a GPU runs (Horovod size 1, in this process)."""

import pytest
import torch

from hvd_bert.config import TrainConfig, apply_overrides
from hvd_bert.pt.engine import Engine
from hvd_bert.pt.step import host_reads


def loss_fn(model, batch):
    x, y = batch
    out = model(x)
    return ((out.float() - y) ** 2).mean(), {"abs_error": (out.float() - y).abs().mean()}


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("optimizer", ["nvlamb", "lamb", "adamw"])
def test_a_step_reads_nothing_to_the_host_until_its_one_transfer(optimizer, stage, monkeypatch):
    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    cfg = apply_overrides(TrainConfig(), [
        f"optim.name={optimizer}", "optim.lr=0.01", f"zero.stage={stage}", "precision.mode=fp16",
        "batch.local_batch_size=4", "batch.backward_passes_per_step=2", "schedule.name=constant",
        "schedule.total_steps=10"] + ([] if optimizer == "nvlamb" else ["optim.max_grad_norm=0.5"]))
    engine = Engine.from_config(model, cfg, loss_fn=loss_fn)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    results, host = [], []
    for step in range(5):
        before = [p.detach().clone() for p in model.parameters()]
        with host_reads() as seen:
            for micro in range(2):
                bad = step == 2 and micro == 1  # an inf in one micro-batch's input: the step skips
                engine.last_metrics = {}
                res = engine.train_micro_batch((x * float("inf") if bad else x, y), defer=True)
                sums = {k: v / 2 for k, v in engine.last_metrics.items()}
        assert seen == [], f"host reads inside step {step}: {seen}"
        with host_reads() as seen:
            result, metrics = engine.finish_step(res, sums)
        assert seen == ["tolist"], seen  # the step's one transfer
        results.append(result)
        host.append(metrics)
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert unchanged == (step == 2), f"step {step}: skipped {result.skipped}"
    assert [r.skipped for r in results] == [False, False, True, False, False]
    assert [r.step for r in results] == [1, 2, 2, 3, 4] and engine.skipped_steps == 1
    assert results[2].loss_scale == results[1].loss_scale / 2  # the overflow backed the scale off
    assert all(r.grad_norm > 0 for i, r in enumerate(results) if i != 2)
    assert set(host[0]) == {"loss", "abs_error"} and all(isinstance(v, float) for v in host[0].values())


def fitted(reads: str, monkeypatch, total: int = 10, log_every: int = 5, bad_step: int | None = None):
    """A small model trained by ``fit`` (fp16 loss scaling, NVLAMB, k=3), its reads counted:
    the number of ``finish_steps`` calls and of steps each read, and the result."""
    from hvd_bert.train.loop import fit

    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "0")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    cfg = apply_overrides(TrainConfig(), ["optim.name=nvlamb", "optim.lr=0.01", "batch.local_batch_size=4",
                                          "batch.backward_passes_per_step=3", "schedule.name=constant",
                                          "precision.mode=fp16", f"host_reads={reads}"])
    engine = Engine.from_config(model, cfg, loss_fn=loss_fn)
    reads = []
    original = engine.finish_steps

    def finish(steps):
        reads.append([type(r).__name__ for r, _ in steps])
        return original(steps)
    engine.finish_steps = finish
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    n = iter(range(10 ** 6))

    def batch():  # micro-batch number 3 * bad_step + 1 holds an inf: that step is skipped
        i = next(n)
        return (x * float("inf") if bad_step is not None and i == 3 * bad_step + 1 else x, y)
    with host_reads() as seen:
        res = fit(engine, lambda start: iter(batch, None), total_steps=total, output_dir=False,
                  progress=False, log_every=log_every)
    return res, reads, seen, [p.detach().clone() for p in model.parameters()]


def test_the_loop_reads_every_step_or_only_where_it_logs(monkeypatch):
    """``train.host_reads=step``: one read (``finish_steps``, one transfer) per optimizer step;
    ``log``: one per log interval, of that interval's steps, with the same training (fp32
    arithmetic of the same steps: equal weights). ``tolist`` is the only read of a training
    tensor (the stop request and the logged means are host values already)."""
    every, reads_every, seen_every, weights_every = fitted("step", monkeypatch)
    windowed, reads_windowed, seen_windowed, weights_windowed = fitted("log", monkeypatch)
    assert reads_every == [["DeviceStep"]] * 10 and seen_every.count("tolist") == 10
    assert reads_windowed == [["DeviceStep"] * 5] * 2 and seen_windowed.count("tolist") == 2
    assert every.steps == windowed.steps == 10
    assert all(torch.equal(a, b) for a, b in zip(weights_every, weights_windowed))
    assert [h["loss"] for h in every.history] == [h["loss"] for h in windowed.history]


def test_a_step_skipped_inside_a_window_is_counted_when_it_is_read(monkeypatch):
    """An overflow at the 3rd step, read at the log of the 5th: the run still ends after 10
    applied steps, one skipped, and logs at steps 5 and 10 (the window after the skip reads
    again at the 5th applied step)."""
    res, reads, _, _ = fitted("log", monkeypatch, bad_step=2)
    assert res.steps == 10 and res.skipped_steps == 1
    assert [h["step"] for h in res.history] == [5, 10]
    assert sum(len(r) for r in reads) == 11


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_bf16_weights_over_fp32_masters_step_on_the_device_too(stage, monkeypatch):
    """``train.precision.weights=bf16``: the parameters and gradients are bf16, the step reads
    nothing to the host, a step with an inf changes neither the weights nor the masters, and the
    masters are what the weights round (LAMB with clipping, k=2)."""
    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "0")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    cfg = apply_overrides(TrainConfig(), [
        "optim.name=lamb", "optim.lr=0.01", f"zero.stage={stage}", "precision.mode=bf16",
        "precision.weights=bf16", "batch.local_batch_size=4", "batch.backward_passes_per_step=2",
        "schedule.name=constant", "schedule.total_steps=10", "optim.max_grad_norm=0.5"])
    engine = Engine.from_config(model, cfg, loss_fn=loss_fn)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    for step in range(4):
        before = [p.detach().clone() for p in model.parameters()]
        masters = engine.model_state()
        with host_reads() as seen:
            for micro in range(2):
                bad = step == 2 and micro == 1
                res = engine.train_micro_batch((x * float("inf") if bad else x, y), defer=True)
        assert seen == [], f"host reads inside step {step}: {seen}"
        result, _ = engine.finish_step(res, {})
        assert result.skipped == (step == 2)
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert unchanged == (step == 2)
        after = engine.model_state()
        assert all(torch.equal(masters[k], after[k]) for k in after) == (step == 2)
        for name, p in model.named_parameters():
            assert after[name].dtype == torch.float32 and torch.equal(after[name].bfloat16(), p.detach())
    assert engine.memory()["parameters"] == sum(p.numel() for p in model.parameters()) * 2
