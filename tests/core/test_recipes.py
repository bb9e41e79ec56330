"""recipes/*.yaml: each loads into its job's config with nothing unknown or inapplicable, holds
the published numbers it claims (NVIDIA's LAMB recipe for BERT-Large as ../shared/REFERENCE.md
gives it, Google's BERT-Base, run_squad and run_classifier settings, the NCF ladder's measured
rungs), and ``hvd-bert config --job J --config R`` prints it resolved."""

from pathlib import Path

import pytest
import yaml

from hvd_bert.cli import main
from hvd_bert.config import FinetuneConfig, NCFConfig, PretrainConfig, load_config
from hvd_bert.core.cost_model import BERT_LARGE_PHASES

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
JOB = {"bert-large-phase1": "pretrain", "bert-large-phase2": "pretrain", "bert-base": "pretrain",
       "squad": "finetune", "glue": "finetune", **{p.stem: "ncf" for p in RECIPES.glob("ncf-ladder-*.yaml")}}
CLASS = {"pretrain": PretrainConfig, "finetune": FinetuneConfig, "ncf": NCFConfig}


def recipe(name):
    return load_config(CLASS[JOB[name]], RECIPES / f"{name}.yaml")


def test_every_recipe_file_is_known():
    assert sorted(p.stem for p in RECIPES.glob("*.yaml")) == sorted(JOB)
    assert len([n for n in JOB if n.startswith("ncf-ladder-")]) == 5


@pytest.mark.parametrize("name", sorted(JOB))
def test_a_recipe_loads_and_config_prints_it_resolved(name, capsys):
    cfg = recipe(name)
    assert main(["config", "--job", JOB[name], "--config", str(RECIPES / f"{name}.yaml")]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["optim"]["lr"] == cfg.train.optim.lr
    assert printed["train"]["batch"]["global_batch_size"] == cfg.train.batch.global_batch_size


@pytest.mark.parametrize("name,seq,pred,gbatch,lr,warmup,steps", [
    ("bert-large-phase1", 128, 20, 65536, 6e-3, 0.2843, 7038),
    ("bert-large-phase2", 512, 80, 32768, 4e-3, 0.128, 1563)])
def test_bert_large_is_nvidias_lamb_recipe(name, seq, pred, gbatch, lr, warmup, steps):
    c = recipe(name)
    t = c.train
    assert (c.model, c.max_seq_length, c.max_predictions_per_seq) == ("large", seq, pred)
    assert (t.optim.name, t.optim.lr, t.optim.weight_decay) == ("nvlamb", lr, 0.01)
    assert (t.schedule.name, t.schedule.warmup, t.schedule.total_steps, t.schedule.power) == \
        ("poly_warmup", warmup, steps, 0.5)
    plan = t.batch.plan(world_size=1024)  # global = local x k x world, k derived
    assert plan.global_batch_size == gbatch == plan.backward_passes_per_step * 1024 * plan.local_batch_size
    phase = {"bert-large-phase1": 0, "bert-large-phase2": 1}[name]
    assert BERT_LARGE_PHASES[phase][1:] == (steps, gbatch, seq)  # what simulate --bert-recipe projects


def test_fine_tuning_recipes_are_googles():
    squad, glue = recipe("squad"), recipe("glue")
    assert squad.task == "squad" and squad.epochs == 2 and squad.train.batch.global_batch_size == 24
    assert squad.train.optim.lr == 3e-5 and glue.train.optim.lr == 2e-5 and glue.epochs == 3
    for c in (squad, glue):
        o, s = c.train.optim, c.train.schedule
        assert (o.name, o.weight_decay, o.max_grad_norm, s.warmup, s.power) == ("adamw", 0.01, 1.0, 0.1, 1.0)


def test_bert_base_is_googles():
    c = recipe("bert-base")
    assert c.model == "base" and c.train.batch.global_batch_size == 256 and c.train.optim.lr == 1e-4
    assert c.train.schedule.total_steps == 1_000_000 and c.train.schedule.warmup * 1_000_000 == 10_000


def test_the_ncf_ladder_climbs_in_batch():
    rungs = [recipe(n) for n in sorted(n for n in JOB if n.startswith("ncf-ladder-"))]
    assert [r.train.batch.global_batch_size for r in rungs] == [1024, 16384, 196608, 196608, 196608]
    assert [r.train.optim.name for r in rungs] == ["adamw", "adamw", "adamw", "lars", "lars"]
    assert rungs[1].train.optim.lr == pytest.approx(rungs[0].train.optim.lr * 16)  # the linear rule
    assert rungs[-1].train.precision.mode == "bf16" and rungs[3].train.precision.mode == "fp32"
