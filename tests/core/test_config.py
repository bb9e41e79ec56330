"""Typed configuration: YAML loading, overrides, errors that name the key."""

import subprocess
import sys

import pytest
import yaml

from hvd_bert.config import (ConfigError, OptimConfig, ScheduleConfig, TrainConfig, apply_overrides, explain,
                             from_dict, load_config, to_dict)
from hvd_bert.core.schedules import make_schedule


def test_defaults_round_trip_through_dict():
    cfg = TrainConfig()
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


def test_yaml_file_with_partial_sections(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("optim:\n  name: lars\n  lr: 2.5\nbatch:\n  local_batch_size: 16\nseed: 3\n")
    cfg = load_config(TrainConfig, p)
    assert cfg.optim.name == "lars" and cfg.optim.lr == 2.5 and cfg.seed == 3
    assert cfg.optim.beta1 == 0.9  # untouched default


def test_overrides_are_type_checked_and_parsed_as_yaml():
    cfg = apply_overrides(TrainConfig(), ["optim.lr=1e-3", "batch.backward_passes_per_step=4",
                                          "optim.exclude=[bias, norm]", "precision.mode=fp16"])
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)
    assert cfg.batch.backward_passes_per_step == 4
    assert cfg.optim.exclude == ("bias", "norm")
    assert cfg.precision.mode == "fp16"


@pytest.mark.parametrize("override,match", [
    ("optim.lrr=1", r"unknown key 'optim.lrr' \(did you mean 'lr'\?\)"),
    ("optimm.lr=1", r"unknown key 'optimm.lr'"),
    ("optim.lr=fast", r"optim.lr: expected float, got 'fast'"),
    ("seed=1.5", r"seed: expected int, got 1.5"),
    ("seed=true", r"seed: expected int, got True"),
    ("optim.nesterov=1", r"optim.nesterov: expected bool"),
    ("optim.name=adam", r"optim.name: expected one of 'sgd', 'adamw', 'lamb', 'nvlamb', 'lars'"),
    ("optim.lr=-1", r"optim.lr must be in \(0, 1e4\), got -1"),
    ("optim.lr", r"must look like key.path=value"),
    ("seed.x=1", r"'x' is not a section"),
])
def test_bad_overrides_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides(TrainConfig(), [override])


def test_unknown_yaml_key_and_bad_file(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("schedule:\n  totl_steps: 5\n")
    with pytest.raises(ConfigError, match=r"unknown key 'schedule.totl_steps'"):
        load_config(TrainConfig, p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(TrainConfig, tmp_path / "missing.yaml")
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(TrainConfig, p)
    p.write_text("optim: {lr: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(TrainConfig, p)


def test_configs_are_frozen():
    import dataclasses
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainConfig().seed = 3


def test_batch_section_validates_through_plan():
    cfg = apply_overrides(TrainConfig(), ["batch.local_batch_size=8", "batch.global_batch_size=48"])
    assert cfg.batch.plan(2).backward_passes_per_step == 3
    with pytest.raises(ConfigError, match="not a multiple"):
        cfg.batch.plan(4)


def test_lr_scaling_and_schedule_factory():
    o = OptimConfig(name="sgd", lr=0.1, lr_scaling="linear", base_batch_size=256)
    assert o.peak_lr(8192) == pytest.approx(3.2)
    s = make_schedule(ScheduleConfig(name="linear_warmup", warmup_steps=5, warmup_init_lr=0.1),
                      o.peak_lr(8192))
    assert s(0) == pytest.approx(0.1) and s(5) == pytest.approx(3.2)
    bert = make_schedule(ScheduleConfig(name="poly_warmup", warmup=0.2843, total_steps=7038), 6e-3)
    assert bert(2001) == pytest.approx(0.005075894589)


def test_masks_follow_each_optimizers_default():
    names = ["dense.weight", "dense.bias"]
    assert OptimConfig(name="lamb").masks(names) == ([True, False], [True, True])
    assert OptimConfig(name="nvlamb").masks(names) == ([True, False], [True, False])
    assert OptimConfig(name="nvlamb", trust_ratio_on_excluded=True).masks(names)[1] == [True, True]
    assert OptimConfig(name="lars").masks(["bn.BatchNorm.weight", "w"]) == ([False, True], [False, True])


def test_explain_lists_documented_fields():
    lines = explain(TrainConfig)
    assert any(line.startswith("optim.lr (float, default 0.001): peak learning rate") for line in lines)
    assert any(line.startswith("batch.backward_passes_per_step") for line in lines)


def test_importing_common_imports_no_framework():
    code = ("import sys, hvd_bert.config, hvd_bert.core.optim, hvd_bert.core.schedules, "
            "hvd_bert.core.batch, hvd_bert.core.sharding\n"
            "bad = [m for m in ('torch', 'tensorflow', 'horovod', 'tf_keras', 'keras') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "import os; assert os.environ['TF_USE_LEGACY_KERAS'] == '1'")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PATH": "/usr/bin:/bin"})


def test_a_partial_recipe_overrides_only_the_keys_it_names(tmp_path):
    """A recipe of one key changes that key and keeps the job's defaults (not the section
    classes' generic ones), exactly as --set does."""
    from hvd_bert.config import PretrainConfig

    p = tmp_path / "s.yaml"
    p.write_text("train:\n  seed: 3\n")
    from_recipe = load_config(PretrainConfig, p)
    assert from_recipe == load_config(PretrainConfig, None, ["train.seed=3"])
    assert from_recipe.train.seed == 3
    assert from_recipe.train.optim.name == "nvlamb" and from_recipe.train.optim.lr == 5e-3
    assert from_recipe.train.schedule.total_steps == 100
    assert from_recipe.train.batch.backward_passes_per_step == 2
    assert from_recipe.train.output_dir == ""  # the job default (runs/<job>-<framework>-<data>)


def test_explain_shows_the_jobs_defaults():
    from hvd_bert.config import PretrainConfig

    lines = explain(PretrainConfig)
    assert any(ln.startswith("train.optim.name (") and "default 'nvlamb'" in ln for ln in lines)
    assert any(ln.startswith("train.schedule.total_steps (") and "default 100" in ln for ln in lines)


@pytest.mark.parametrize("overrides,match", [
    (["optim.eta=0.002"],
     r"train.optim.eta=0.002 does not apply to train.optim.name='lamb' \(it is read by lars\)"),
    (["train.optim.name=sgd", "train.optim.beta1=0.8"],
     r"train.optim.beta1=0.8 does not apply to train.optim.name"),
    (["optim.nesterov=true"], r"train.optim.nesterov=True does not apply"),
    (["optim.name=adamw", "optim.bias_correction=false"], r"bias_correction=False does not apply"),
])
def test_a_setting_the_optimizer_does_not_read_is_an_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TrainConfig, None, overrides)


def test_settings_that_apply_are_accepted_in_any_order():
    cfg = load_config(TrainConfig, None, ["optim.eta=0.002", "optim.name=lars", "optim.momentum=0.8"])
    assert cfg.optim.eta == 0.002 and cfg.optim.name == "lars"
    # a job's own defaults (NCF's Adam betas) do not count as settings given by the user
    from hvd_bert.evaluation.ncf import NCFConfig
    assert load_config(NCFConfig, None, ["train.optim.name=lars"]).train.optim.beta1 == 0.25


def test_total_steps_given_alone_wins_over_finetunings_default_epochs(tmp_path):
    from hvd_bert.config import FinetuneConfig

    cfg = load_config(FinetuneConfig, None, ["train.schedule.total_steps=30"])
    assert cfg.epochs == 0 and cfg.train.schedule.total_steps == 30
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  schedule:\n    total_steps: 40\n")
    assert load_config(FinetuneConfig, recipe).epochs == 0
    assert load_config(FinetuneConfig, None, ["epochs=2"]).epochs == 2  # (epochs given: the default horizon)
    with pytest.raises(ConfigError, match=r"epochs=2 and train.schedule.total_steps=30 both set the run's"):
        load_config(FinetuneConfig, None, ["epochs=2", "train.schedule.total_steps=30"])


def test_an_ncf_run_is_as_long_as_its_epochs():
    from hvd_bert.config import NCFConfig

    with pytest.raises(ConfigError, match=r"NCF run's length is set by epochs.*--set epochs=N"):
        load_config(NCFConfig, None, ["train.schedule.total_steps=30"])


def test_a_key_of_a_section_given_without_it_is_pointed_there():
    from hvd_bert.config import PretrainConfig

    with pytest.raises(ConfigError, match=r"unknown key 'optim.lr'.*this job's key is train.optim.lr$"):
        load_config(PretrainConfig, None, ["optim.lr=1e-3"])
    with pytest.raises(ConfigError, match=r"unknown key 'train.optim.lrr' \(did you mean 'lr'\?\)") as e:
        load_config(PretrainConfig, None, ["train.optim.lrr=1e-3"])
    assert "this job's key" not in str(e.value)


def test_the_engines_settings_have_the_jobs_names_everywhere(tmp_path):
    """One namespace: train.optim.lr on the command line, in a recipe and in the Python API."""
    from pathlib import Path

    from hvd_bert.config import FinetuneConfig

    given = ["train.optim.lr=1e-3", "train.batch.global_batch_size=256", "train.schedule.total_steps=7"]
    own = apply_overrides(TrainConfig(), given)
    assert own == apply_overrides(TrainConfig(), [g.replace("train.", "", 1) for g in given])  # also without
    assert own.optim.lr == 1e-3 and own.schedule.total_steps == 7
    job = load_config(FinetuneConfig, None, given).train  # (a job's defaults are its own, e.g. AdamW)
    assert (job.optim.lr, job.batch.global_batch_size, job.schedule.total_steps) == (1e-3, 256, 7)
    recipe = Path(__file__).parents[2] / "recipes" / "squad.yaml"  # a job's recipe: its train: section
    section = yaml.safe_load(recipe.read_text())["train"]
    loaded = to_dict(load_config(TrainConfig, recipe))
    assert section and all(loaded[k][n] == v for k, sub in section.items() if isinstance(sub, dict)
                           for n, v in sub.items())
    (tmp_path / "own.yaml").write_text("optim:\n  lr: 0.002\n")  # a TrainConfig file of its own
    assert load_config(TrainConfig, tmp_path / "own.yaml").optim.lr == 0.002
    with pytest.raises(ConfigError, match=r"unknown key 'train.optim.lrr' \(did you mean 'lr'\?\)"):
        apply_overrides(TrainConfig(), ["train.optim.lrr=1"])


@pytest.mark.parametrize("given,local,k", [
    (["train.batch.global_batch_size=256"], 32, 4),                                       # k derived
    (["train.batch.global_batch_size=256", "train.batch.local_batch_size=16"], 16, 8),    # k derived
    (["train.batch.global_batch_size=256", "train.batch.backward_passes_per_step=1"], 128, 1)])  # local
def test_a_given_global_batch_derives_what_the_user_did_not_give(given, local, k):
    """Pretraining's defaults (local 32, k 2) do not conflict with a global batch the user gave:
    what the user did not give is derived; three given values that disagree are an error."""
    from hvd_bert.config import PretrainConfig

    plan = load_config(PretrainConfig, None, given).train.batch.plan(world_size=2)
    assert (plan.local_batch_size, plan.backward_passes_per_step, plan.global_batch_size) == (local, k, 256)
    engine_cfg = load_config(TrainConfig, None, [g[len("train."):] for g in given])  # the Python API's names
    assert engine_cfg.batch.plan(2).global_batch_size == 256
    clash = load_config(PretrainConfig, None, [*given[:1], "train.batch.local_batch_size=16",
                                               "train.batch.backward_passes_per_step=4"])
    with pytest.raises(ConfigError, match="inconsistent batch sizes.*drop one of the three"):
        clash.train.batch.plan(world_size=2)


@pytest.mark.parametrize("key", ["pack_sequences", "compile_layers"])
def test_packed_sequences_and_compiled_layers_are_pytorch_s_only(key):
    from hvd_bert.config.jobs import PretrainConfig
    assert getattr(apply_overrides(PretrainConfig(), [f"{key}=true"]), key)
    with pytest.raises(ConfigError, match=rf"{key} is PyTorch's.*use framework=pt or {key}=false"):
        apply_overrides(PretrainConfig(), [f"{key}=true", "framework=tf"])


def test_varlen_attention_is_how_packed_rows_attend():
    """``packed_attention`` takes bias or varlen, and varlen only with packed rows (one line)."""
    from hvd_bert.config.jobs import PretrainConfig
    cfg = apply_overrides(PretrainConfig(), ["pack_sequences=true", "packed_attention=varlen"])
    assert cfg.packed_attention == "varlen"
    with pytest.raises(ConfigError, match="packed_attention=varlen is how packed rows attend: set "
                                          "pack_sequences=true too"):
        apply_overrides(PretrainConfig(), ["packed_attention=varlen"])
    with pytest.raises(ConfigError, match="packed_attention"):
        apply_overrides(PretrainConfig(), ["pack_sequences=true", "packed_attention=flash"])


def test_the_global_batch_alone_is_reached_on_any_world_size():
    """``--set train.batch.global_batch_size=32`` alone on 2 ranks: local 16, one micro-batch (not
    a refusal for 32 x 2 ranks); given with a local batch, k is derived from it."""
    from hvd_bert.config import PretrainConfig, load_config

    cfg = load_config(PretrainConfig, None, ["train.batch.global_batch_size=32"])
    plan = cfg.train.batch.plan(2)
    assert (plan.local_batch_size, plan.backward_passes_per_step) == (16, 1)
    cfg = load_config(PretrainConfig, None, ["train.batch.global_batch_size=256",
                                             "train.batch.local_batch_size=8"])
    assert cfg.train.batch.plan(2).backward_passes_per_step == 16


def test_a_recipes_job_names_are_the_job_configs():
    from hvd_bert.config import JOB_CONFIGS
    from hvd_bert.config.base import RECIPE_JOBS

    assert set(RECIPE_JOBS) == {c.JOB for c in JOB_CONFIGS.values() if hasattr(c, "JOB")}


def test_an_empty_text_setting_says_how_to_write_one():
    """``--set eval_data=`` reads as null (YAML): the line says to write ``eval_data=''``."""
    from hvd_bert.config.jobs import PretrainConfig
    with pytest.raises(ConfigError, match=r"eval_data: expected text, got nothing; for an empty value write "
                                          r"eval_data=''"):
        apply_overrides(PretrainConfig(), ["eval_data="])
    assert apply_overrides(PretrainConfig(), ["eval_data=''"]).eval_data == ""


@pytest.mark.parametrize("setting, words", [("schedule.power=-1", "power must be > 0"),
                                            ("schedule.end_lr=-1", "end_lr and warmup_init_lr must be in"),
                                            ("schedule.factor=-0.5", "factor must be in \\(0, 1\\]"),
                                            ("schedule.factor=1e300", "factor must be in \\(0, 1\\]")])
def test_a_schedule_that_would_rise_past_its_peak_or_below_zero_is_refused(setting, words):
    with pytest.raises(ConfigError, match=words):
        apply_overrides(TrainConfig(), [setting])


@pytest.mark.parametrize("boundaries", ["[5,2]", "[0,3]", "[2,-1]", "[3,3]"])
def test_step_boundaries_must_be_steps_in_increasing_order(boundaries):
    with pytest.raises(ConfigError, match="train.schedule.boundaries must be steps from 1 up, strictly"):
        apply_overrides(TrainConfig(), ["schedule.name=step", f"schedule.boundaries={boundaries}"])


@pytest.mark.parametrize("job", ["pretrain", "finetune", "ncf"])
def test_deferred_host_reads_are_pytorch_s_only(job):
    from hvd_bert.config import JOB_CONFIGS
    cls = JOB_CONFIGS[job]
    assert apply_overrides(cls(), ["train.host_reads=log"]).train.host_reads == "log"
    with pytest.raises(ConfigError, match=r"train.host_reads=log is PyTorch's .*train.host_reads=step"):
        apply_overrides(cls(), ["train.host_reads=log", "framework=tf"])


@pytest.mark.parametrize("setting", ["horovod.cycle_time_ms=-5", "horovod.cycle_time_ms=0",
                                     "horovod.fusion_threshold_mb=-1"])
def test_horovods_cycle_and_fusion_out_of_range_are_refused(setting):
    with pytest.raises(ConfigError, match=setting.split("=")[0]):
        apply_overrides(TrainConfig(), [setting])


def test_a_stall_timeout_below_a_second_is_refused():
    """A watchdog limit of a nanosecond ends a healthy job at its first phase: 0 or >= 1 s."""
    with pytest.raises(ConfigError, match=r"stall_timeout_s must be 0 \(never\) or at least 1 second"):
        apply_overrides(TrainConfig(), ["stall_timeout_s=1e-9"])
    assert apply_overrides(TrainConfig(), ["stall_timeout_s=0"]).stall_timeout_s == 0


@pytest.mark.parametrize("job", ["pretrain", "finetune", "ncf"])
def test_bf16_weights_need_bf16_autocast_and_pytorch(job):
    from hvd_bert.config import JOB_CONFIGS
    cls = JOB_CONFIGS[job]
    bf16 = ["train.precision.mode=bf16", "train.precision.weights=bf16"]
    got = apply_overrides(cls(), bf16).train.precision
    assert (got.mode, got.weights) == ("bf16", "bf16")
    for mode in ("fp32", "fp16"):
        with pytest.raises(ConfigError, match=rf"weights=bf16 needs train.precision.mode=bf16 .*mode={mode}"):
            apply_overrides(cls(), [f"train.precision.mode={mode}", "train.precision.weights=bf16"])
    with pytest.raises(ConfigError, match=r"train.precision.weights=bf16 is PyTorch's"):
        apply_overrides(cls(), ["train.precision.mode=bf16", "train.precision.weights=bf16", "framework=tf"])
    with pytest.raises(ConfigError):
        apply_overrides(cls(), ["train.precision.weights=fp16"])
    with pytest.raises(ConfigError, match=r"weights=bf16 does not run under train.tensor_parallel > 1 yet"):
        apply_overrides(cls(), ["train.precision.mode=bf16", "train.precision.weights=bf16",
                                "train.tensor_parallel=2"])


@pytest.mark.parametrize("setting", [
    "optim.eps=0", "optim.eps=-1e-8", "optim.eps=5", "optim.weight_decay=1e300", "optim.eta=0",
    "optim.eta=1e9",
    "schedule.warmup_init_lr=-1", "schedule.warmup_init_lr=1e300", "schedule.end_lr=1e300",
    "precision.init_scale=1e300", "precision.init_scale=1e-50", "precision.init_scale=0.5",
    "precision.growth_factor=1e300", "horovod.gradient_predivide_factor=1e-300",
    "horovod.gradient_predivide_factor=0.5", "horovod.gradient_predivide_factor=1e300"])
def test_numbers_beyond_what_a_setting_means_are_refused_in_one_line(setting):
    """Each bound names the setting, its range and what it is for; the values inside stay."""
    key = setting.split("=")[0].split(".")[-1]
    with pytest.raises(ConfigError, match=rf"train\.[a-z]+\.[a-z_/ and]*{key}"):
        apply_overrides(TrainConfig(), [setting])


def test_the_bounds_keep_the_recipes_values():
    apply_overrides(TrainConfig(), ["optim.eps=1e-6", "optim.weight_decay=0.01", "optim.eta=0.001",
                                    "schedule.factor=0.1", "precision.init_scale=65536",
                                    "horovod.gradient_predivide_factor=2"])


@pytest.mark.parametrize("job", ["pretrain", "finetune"])
def test_a_shuffle_buffer_is_a_count_of_records(job):
    from hvd_bert.config import JOB_CONFIGS
    for value in (-5, 1 << 40):
        with pytest.raises(ConfigError, match=r"shuffle_buffer must be in \[0, 16777216\] records"):
            apply_overrides(JOB_CONFIGS[job](), [f"shuffle_buffer={value}"])
