"""What defines a run: the settings a resume may change, and the ones it may not."""

from hvd_bert.common.config import PretrainConfig, apply_overrides, to_dict
from hvd_bert.jobs._identity import run_differences


def cfg(*overrides):
    return to_dict(apply_overrides(PretrainConfig(), list(overrides)))


def test_the_horizon_and_the_cadence_may_change():
    assert run_differences(cfg(), cfg("train.schedule.total_steps=500", "train.log_every=1",
                                      "train.checkpoint_every=7", "progress=false")) == []


def test_model_data_optimizer_and_framework_may_not():
    diffs = run_differences(cfg(), cfg("model=mini", "data=other", "train.optim.lr=1e-3", "framework=tf"))
    assert diffs == ["data: '' -> 'other'", "framework: 'pt' -> 'tf'", "model: 'tiny' -> 'mini'",
                     "train.optim.lr: 0.005 -> 0.001"]
