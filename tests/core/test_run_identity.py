"""What defines a run: the settings a resume may change, and the ones it may not."""

import pytest

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


@pytest.mark.parametrize("damage", [None, b'{"train": {', b"[1, 2]", b"\xff\xfe{}", b'"text"'])
def test_checkpoints_beside_a_missing_or_damaged_config_are_refused_unless_waived(damage, tmp_path):
    from hvd_bert.train.identity import resume_mismatch

    (tmp_path / "ckpt-00000002.pt").write_bytes(b"x")
    if damage is not None:
        (tmp_path / "config.json").write_bytes(damage)
    new = {"train": {"optim": {"lr": 0.1}, "resume_unchecked": False}}
    why = resume_mismatch(tmp_path, new)
    assert why and ("is missing" if damage is None else "is damaged") in why
    assert "--set train.resume_unchecked=true" in why
    assert resume_mismatch(tmp_path, {"train": {**new["train"], "resume_unchecked": True}}) is None
    (tmp_path / "ckpt-00000002.pt").unlink()  # a folder without checkpoints has nothing to check
    assert resume_mismatch(tmp_path, new) is None


def test_the_ranks_settings_are_compared_by_content_and_the_differences_named(tmp_path):
    from hvd_bert.train.identity import rank_identity, ranks_disagree

    for node in ("a", "b"):  # each node's own copy of the same data
        (tmp_path / node).mkdir()
        (tmp_path / node / "dataset.json").write_text('{"kind": "bert"}')
    same = [rank_identity({"data": str(tmp_path / n), "train": {"optim": {"lr": 0.1}}}) for n in "ab"]
    assert ranks_disagree(same) is None
    (tmp_path / "b" / "dataset.json").write_text('{"kind": "bert", "shards": []}')
    other = [rank_identity({"data": str(tmp_path / n), "train": {"optim": {"lr": lr}}})
             for n, lr in (("a", 0.1), ("b", 0.1), ("a", 0.2))]
    line = ranks_disagree(other)
    assert "data is 'dataset " in line and "on ranks 0, 2 but" in line
    assert "train.optim.lr is 0.1 on ranks 0, 1 but 0.2 on rank 2" in line


def test_a_run_of_an_older_version_resumes_where_a_setting_added_since_keeps_its_default(tmp_path):
    """An older version's config.json lacks the settings added since (pack_sequences here): they
    count as the job's defaults, so the run goes on unless this one changes them."""
    import json

    from hvd_bert.config import to_dict
    from hvd_bert.config.jobs import PretrainConfig
    from hvd_bert.train.identity import resume_mismatch

    new = to_dict(PretrainConfig())
    older = {k: v for k, v in new.items() if k != "pack_sequences"}
    (tmp_path / "config.json").write_text(json.dumps(older))
    (tmp_path / "ckpt-00000002.pt").write_bytes(b"x")
    defaults = to_dict(PretrainConfig())
    assert resume_mismatch(tmp_path, new, defaults=defaults) is None
    why = resume_mismatch(tmp_path, {**new, "pack_sequences": True}, defaults=defaults)
    assert why and "pack_sequences: False -> True" in why
    assert "pack_sequences: None -> False" in resume_mismatch(tmp_path, new)  # (without the defaults)
    # what a job's run folder claim passes on (jobs/run_folder.open_run gives the job's defaults)
    from hvd_bert.train.run_folder import claim_run_folder
    claim = claim_run_folder(tmp_path, new, defaults=defaults, hold_until_exit=False)
    assert claim.problem is None
    claim.release()
    claim = claim_run_folder(tmp_path, {**new, "pack_sequences": True}, defaults=defaults,
                             hold_until_exit=False)
    assert claim.problem and claim.problem[0] == "resume"
    assert "pack_sequences: False -> True" in claim.problem[1]
