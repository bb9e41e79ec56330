"""The PyTorch engine in one process (Horovod size 1): construction, misuse, bad checkpoints.
The multi-process behaviour is in tests/parallel/test_engine_contract.py."""

import pytest
import torch

from hvd_bert.config import ConfigError, TrainConfig, apply_overrides
from hvd_bert.core.schedules import Constant
from hvd_bert.pt.engine import Engine
from hvd_bert.pt.optim import Lamb


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def test_construction_takes_no_step_and_creates_state():
    from hvd_bert.train.engine import Engine as Declared

    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    engine = Engine(model, Lamb(model.parameters(), lr=0.1, weight_decay=0.1), schedule=Constant(0.1))
    assert isinstance(engine, Declared)  # (every member train/ uses is there)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    states = list(engine.optimizer.state.values())
    assert len(states) == 4 and all(s["step"].item() == 0 for s in states)


def test_step_in_the_middle_of_a_window_is_an_error():
    model = small_model()
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), schedule=Constant(0.1),
                    backward_passes_per_step=2)
    assert engine.backward(model(torch.ones(2, 3)).sum()) is False
    with pytest.raises(RuntimeError, match="after 1 of 2 micro-batches"):
        engine.step()
    assert engine.backward(model(torch.ones(2, 3)).sum()) is True
    assert engine.step().step == 1


@pytest.mark.parametrize("mode,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_dtype(mode, dtype):
    model = small_model()
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), schedule=Constant(0.1),
                    precision=mode)
    with engine.autocast():
        assert model(torch.ones(2, 3)).dtype == dtype
    assert engine.scaler.is_enabled() == (mode == "fp16")


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "ckpt-00000004.pt").write_bytes(b"not a checkpoint")
    model = small_model()
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), schedule=Constant(0.1))
    with pytest.raises(RuntimeError, match=r"cannot read checkpoint .*ckpt-00000004.pt.*delete it"):
        engine.resume(tmp_path)


def test_no_checkpoint_means_a_fresh_start(tmp_path):
    model = small_model()
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), schedule=Constant(0.1))
    assert engine.resume(tmp_path) is None and engine.step_count == 0


def test_inconsistent_batch_config_names_the_numbers():
    cfg = apply_overrides(TrainConfig(), ["batch.local_batch_size=8", "batch.backward_passes_per_step=2",
                                          "batch.global_batch_size=100"])
    with pytest.raises(ConfigError, match=r"8 x backward_passes_per_step 2 x 1 data-parallel rank = 16"):
        Engine.from_config(small_model(), cfg)


def test_clipping_applies_to_the_reduced_gradient():
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=1.0), schedule=Constant(1.0),
                    max_grad_norm=0.5)
    engine.backward((model(torch.tensor([[3.0, 4.0]])) - 10).square().mean())
    res = engine.step()
    assert res.grad_norm == pytest.approx(100.0)  # d/dw (w.x - 10)^2 = -20 x, norm 100
    assert torch.linalg.vector_norm(model.weight).item() == pytest.approx(0.5)


class _Payload:
    """Unpickling this runs ``touch MARKER``: what a planted checkpoint would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def _planted(path, marker):
    torch.save({"model": {"w": torch.zeros(1)}, "meta": "{}", "x": _Payload(marker)}, path)
    return path


def test_a_planted_checkpoint_is_refused_and_its_code_never_runs(tmp_path):
    from hvd_bert.train.engine import CheckpointError

    marker = tmp_path / "pwned"
    _planted(tmp_path / "ckpt-00000099.pt", marker)
    model = small_model()
    engine = Engine(model, torch.optim.SGD(model.parameters(), lr=0.1), schedule=Constant(0.1))
    with pytest.raises(CheckpointError, match=r"ckpt-00000099.pt holds objects other than tensors.*not "
                                              r"loaded"):
        engine.resume(tmp_path)
    assert not marker.exists() and engine.step_count == 0


def test_a_planted_checkpoint_as_init_checkpoint_or_to_convert_is_refused(tmp_path):
    import subprocess
    import sys

    from hvd_bert.weights.portable import WeightsError
    from hvd_bert.pt.models.bert import read_checkpoint_weights

    marker = tmp_path / "pwned"
    ckpt = _planted(tmp_path / "ckpt-00000001.pt", marker)
    with pytest.raises(WeightsError, match="holds objects other than tensors"):
        read_checkpoint_weights(ckpt)
    res = subprocess.run([sys.executable, "-m", "hvd_bert", "convert", str(tmp_path), "--output",
                          str(tmp_path / "w.npz")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "holds objects other than tensors" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not marker.exists() and not (tmp_path / "w.npz").exists()


def test_a_checkpoint_round_trips_with_json_metadata(tmp_path):
    import json

    model = small_model()
    engine = Engine(model, Lamb(model.parameters(), lr=0.1), schedule=Constant(0.1),
                    loss_fn=lambda m, b: m(b).square().mean())
    for _ in range(2):
        engine.train_micro_batch(torch.ones(2, 3))
    path = engine.save(tmp_path, {"micro_step": 2})
    meta = json.loads(torch.load(path, weights_only=True)["meta"])
    assert meta["step"] == 2 and meta["data"] == {"micro_step": 2} and meta["world_size"] == 1
    fresh = small_model()
    other = Engine(fresh, Lamb(fresh.parameters(), lr=0.1), schedule=Constant(0.1))
    assert other.resume(tmp_path) == {"micro_step": 2} and other.step_count == 2
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_fit_of_a_scripts_own_model_writes_the_run_folder_and_refuses_other_settings(tmp_path):
    """fit() for a user's own model writes what the jobs write (metrics.jsonl, TensorBoard, the
    resolved config.json), resumes with the same settings and refuses a resume with others; it
    takes the run's length, folder and logging from the engine's config (train.*)."""
    import json

    from hvd_bert.train.checkpoint import RunFolderBusy, lock_run_folder, release_run_folder
    from hvd_bert.train.engine import ResumeError
    from hvd_bert.train.loop import fit

    def run(lr, steps):  # the run's length, folder and logging from the config, under the jobs' names
        cfg = apply_overrides(TrainConfig(), [
            f"train.optim.lr={lr}", "train.optim.name=sgd", "train.batch.local_batch_size=4",
            "train.batch.backward_passes_per_step=1", "train.schedule.name=constant",
            f"train.schedule.total_steps={steps}", f"train.output_dir={tmp_path}", "train.log_every=1"])
        model = small_model()
        engine = Engine.from_config(model, cfg, loss_fn=lambda m, b: ((m(b[0]) - b[1]) ** 2).mean())
        batches = lambda start: iter(lambda: (torch.ones(4, 3), torch.zeros(4, 1)), None)  # noqa: E731
        return fit(engine, batches, progress=False)

    assert run(0.01, 3).steps == 3
    assert json.loads((tmp_path / "config.json").read_text())["train"]["optim"]["lr"] == 0.01
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert list((tmp_path / "tensorboard").iterdir())
    assert run(0.01, 5).steps == 5  # the same settings, a longer horizon: a resume
    with pytest.raises(ResumeError, match=r"other settings.*optim.lr: 0.01 -> 0.02"):
        run(0.02, 6)
    # the folder is claimed as a job claims it (train.run_folder): locked while fit runs, and a
    # folder another job holds is refused before anything is written
    held = lock_run_folder(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(RunFolderBusy, match="in use by another job"):
        run(0.01, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    release_run_folder(held)
    assert run(0.01, 7).steps == 7 and not (tmp_path / ".hvd_bert.lock").exists()
    # arguments win over the config; output_dir=False: no run folder
    cfg = apply_overrides(TrainConfig(), ["train.optim.name=sgd", "train.batch.local_batch_size=4",
                                          "train.batch.backward_passes_per_step=1",
                                          f"train.output_dir={tmp_path / 'unused'}"])
    engine = Engine.from_config(small_model(), cfg, loss_fn=lambda m, b: ((m(b[0]) - b[1]) ** 2).mean())
    res = fit(engine, lambda start: iter(lambda: (torch.ones(4, 3), torch.zeros(4, 1)), None), total_steps=2,
              output_dir=False, progress=False)
    assert res.steps == 2 and res.checkpoint is None and not (tmp_path / "unused").exists()


def test_the_jobs_backend_builds_and_steps_optimizers_without_importing_torchdynamo():
    """The backend's start-up saving (BENCHMARKS.md, "Start-up of one rank"): in a fresh
    interpreter, after the skip, LAMB and Horovod's state handling work and TorchDynamo stays
    unloaded; with TorchDynamo already loaded the skip changes nothing."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from hvd_bert.pt.backend import _optimizers_without_dynamo\n"
        "from hvd_bert.pt.optim import Lamb\n"
        "_optimizers_without_dynamo()\n"
        "p = torch.nn.Parameter(torch.ones(4))\n"
        "opt = Lamb([p], lr=0.1)\n"
        "p.grad = torch.full((4,), 0.5)\n"
        "opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())\n"
        "assert p.grad is None and float(p[0]) < 1.0\n"
        "print('torch._dynamo' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "False"
    loaded = subprocess.run([sys.executable, "-c", "import torch._dynamo\n" + code], capture_output=True,
                            text=True, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "True", loaded.stderr[-3000:]
