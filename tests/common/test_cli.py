"""The hvd-bert command's framework-free subcommands."""

import subprocess
import sys

import yaml


def hvd_bert(*args):
    return subprocess.run([sys.executable, "-m", "hvd_bert", *args], capture_output=True, text=True,
                          timeout=60)


def test_config_prints_resolved_yaml_with_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("optim: {name: lars}\n")
    p = hvd_bert("config", "--config", str(recipe), "--set", "optim.lr=2.0", "--set", "seed=5")
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert cfg["optim"]["name"] == "lars" and cfg["optim"]["lr"] == 2.0 and cfg["seed"] == 5


def test_config_error_names_the_key_and_exits_2():
    p = hvd_bert("config", "--set", "optim.learning_rate=1")
    assert p.returncode == 2
    assert "unknown key 'optim.learning_rate'" in p.stderr


def test_config_explain_documents_fields():
    p = hvd_bert("config", "--explain")
    assert p.returncode == 0 and "batch.backward_passes_per_step" in p.stdout


def test_no_subcommand_is_a_usage_error():
    p = hvd_bert()
    assert p.returncode == 2 and "doctor" in p.stderr


def test_config_shows_a_jobs_settings():
    p = hvd_bert("config", "--job", "finetune", "--set", "epochs=2")
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert cfg["epochs"] == 2 and cfg["train"]["optim"]["name"] == "adamw"
    p = hvd_bert("config", "--job", "pretrain", "--explain")
    assert "init_checkpoint" in p.stdout and "train.optim.lr" in p.stdout


def test_convert_explains_what_it_cannot_convert(tmp_path):
    p = hvd_bert("convert", str(tmp_path), "--output", str(tmp_path / "w.npz"))
    assert p.returncode == 2
    assert "is neither a run folder with a ckpt-*.pt checkpoint nor a Hugging Face" in p.stderr
    (tmp_path / "ckpt-00000001.pt").write_bytes(b"")
    p = hvd_bert("convert", str(tmp_path / "ckpt-00000001.pt"), "--framework", "tf", "--output", "w.npz")
    assert p.returncode == 2 and "is a PyTorch checkpoint; use --framework pt" in p.stderr
