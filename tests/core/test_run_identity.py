"""What defines a run: the settings a resume may change, and the ones it may not."""

from hvd_bert.config import PretrainConfig, apply_overrides, to_dict
from hvd_bert.train.identity import run_differences


def cfg(*overrides):
    return to_dict(apply_overrides(PretrainConfig(), list(overrides)))


def test_the_horizon_and_the_cadence_may_change():
    assert run_differences(cfg(), cfg("train.schedule.total_steps=500", "train.log_every=1",
                                      "train.checkpoint_every=7", "progress=false")) == []


def test_model_data_optimizer_and_framework_may_not():
    diffs = run_differences(cfg(), cfg("model=mini", "data=other", "train.optim.lr=1e-3", "framework=tf"))
    assert diffs == ["data: '' -> 'other'", "framework: 'pt' -> 'tf'", "model: 'tiny' -> 'mini'",
                     "train.optim.lr: 0.005 -> 0.001"]


def test_default_run_folders_differ_by_job_framework_and_data():
    from dataclasses import replace

    from hvd_bert.config import FinetuneConfig, PretrainConfig
    from hvd_bert.evaluation.ncf import NCFConfig
    from hvd_bert.jobs.run_folder import with_run_folder

    def folder(cls, job, **kw):
        return with_run_folder(replace(cls(), **kw), job).train.output_dir

    names = {folder(PretrainConfig, "pretrain", data="/d/stdlib-seq128"),
             folder(PretrainConfig, "pretrain", data="/d/stdlib-seq128", framework="tf"),
             folder(PretrainConfig, "pretrain", data="/d/stdlib-seq512/"),
             folder(FinetuneConfig, "finetune", data="data/mrpc-train"),
             folder(FinetuneConfig, "finetune", data="data/cola train"),
             folder(NCFConfig, "ncf", data="/c/ncf-synthetic-ml-1m"),
             folder(NCFConfig, "ncf", data="/c/ncf-synthetic-ml-1m", framework="tf")}
    assert names == {"runs/pretrain-pt-stdlib-seq128", "runs/pretrain-tf-stdlib-seq128",
                     "runs/pretrain-pt-stdlib-seq512", "runs/finetune-pt-mrpc-train",
                     "runs/finetune-pt-cola_train", "runs/ncf-pt-ncf-synthetic-ml-1m",
                     "runs/ncf-tf-ncf-synthetic-ml-1m"}
    given = replace(PretrainConfig(), train=replace(PretrainConfig().train, output_dir="runs/mine"))
    assert with_run_folder(given, "pretrain").train.output_dir == "runs/mine"
