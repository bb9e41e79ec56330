"""The hvd-bert command's framework-free subcommands."""

import subprocess
import sys

import pytest
import yaml


def hvd_bert(*args):
    return subprocess.run([sys.executable, "-m", "hvd_bert", *args], capture_output=True, text=True,
                          timeout=60)


def test_config_prints_resolved_yaml_with_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train: {optim: {name: lars}}\n")
    p = hvd_bert("config", "--config", str(recipe), "--set", "train.optim.lr=2.0", "--set", "seed=5")
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)["train"]  # the engine's settings under the jobs' names
    assert cfg["optim"]["name"] == "lars" and cfg["optim"]["lr"] == 2.0 and cfg["seed"] == 5
    (tmp_path / "printed.yaml").write_text(p.stdout)  # what it prints is a recipe that loads back
    again = yaml.safe_load(hvd_bert("config", "--config", str(tmp_path / "printed.yaml")).stdout)["train"]
    assert again == cfg


def test_config_error_names_the_key_and_exits_2():
    p = hvd_bert("config", "--set", "train.optim.learning_rate=1")
    assert p.returncode == 2
    assert "unknown key 'train.optim.learning_rate'" in p.stderr


def test_config_explain_documents_fields():
    p = hvd_bert("config", "--explain")
    assert p.returncode == 0 and "\ntrain.batch.backward_passes_per_step (" in p.stdout


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


def test_prepare_ncf_reads_ml_100k_with_the_mlperf_protocol_and_names_a_bad_line(tmp_path):
    rows = "".join(f"{u}\t{(u * 37 + j * 53) % 1500 + 1}\t{1 + (u + j) % 5}\t{880000000 + 100 * u + j}\n"
                   for u in range(1, 41) for j in range(40))
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_text(rows)
    p = hvd_bert("prepare-ncf", "--movielens", str(tmp_path / "ml-100k"), "--eval-negatives", "999",
                 "--output", str(tmp_path / "d"))
    assert p.returncode == 0, p.stderr
    assert "40 users" in p.stdout and "999 negatives per user" in p.stdout
    (tmp_path / "bad.data").write_text(rows + "41\t7\n")
    p = hvd_bert("prepare-ncf", "--movielens", str(tmp_path / "bad.data"), "--output", str(tmp_path / "e"))
    assert p.returncode == 2 and f"line {rows.count(chr(10)) + 1}" in p.stderr, p.stderr
    assert "--skip-bad-lines" in p.stderr
    assert not (tmp_path / "e").exists()
    p = hvd_bert("prepare-ncf", "--movielens", str(tmp_path / "bad.data"), "--skip-bad-lines",
                 "--output", str(tmp_path / "e"))
    assert p.returncode == 0 and "skipped 1 malformed line(s)" in p.stderr, p.stderr


@pytest.mark.parametrize("job", ["train", "pretrain", "finetune", "ncf"])
def test_the_help_examples_of_config_and_set_run(job, capsys):
    """Every ``e.g. --config ...`` / ``e.g. --set ...`` of a job's --help loads (run from the checkout)."""
    import argparse
    import os
    import re
    from pathlib import Path

    from hvd_bert.cli import build_parser, main

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = sub.choices["config" if job == "train" else job].format_help()
    examples = re.findall(r"e\.g\.\s+(--(?:config|set))\s+(\S+?)[,)\s]", text)
    assert {flag for flag, _ in examples} == ({"--set"} if job == "train" else {"--config", "--set"})
    here = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])
    try:
        for flag, value in examples:
            assert main(["config", "--job", job, flag, value]) == 0, (flag, value)
    finally:
        os.chdir(here)
    capsys.readouterr()


@pytest.mark.parametrize("job, recipe, its_job", [("finetune", "recipes/bert-large-phase1.yaml", "pretrain"),
                                                  ("ncf", "recipes/glue.yaml", "finetune"),
                                                  ("pretrain", "recipes/ncf-ladder-1-baseline.yaml", "ncf")])
def test_a_recipe_given_to_another_job_is_refused_naming_both(job, recipe, its_job):
    from pathlib import Path

    root = Path(__file__).parents[2]
    p = subprocess.run([sys.executable, "-m", "hvd_bert", job, "--config", recipe], capture_output=True,
                       text=True, timeout=60, cwd=root)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert f"is a recipe for hvd-bert {its_job}, not {job}" in lines[0]
    assert f"hvd-bert {its_job} --config {recipe}" in lines[0]


def test_every_recipe_names_its_job():
    from pathlib import Path

    for recipe in sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml")):
        assert yaml.safe_load(recipe.read_text()).get("job") in ("pretrain", "finetune", "ncf"), recipe


def test_a_command_that_is_not_a_training_loop_stops_at_once_on_a_signal(tmp_path):
    """prepare-bert interrupted: one line, status 130, and no output folder half written."""
    import os
    import signal
    import time

    text = tmp_path / "t.txt"
    text.write_text("".join(f"Some words of sentence {n} here. Another sentence follows it.\n\n"
                            for n in range(200_000)))
    proc = subprocess.Popen([sys.executable, "-m", "hvd_bert", "prepare-bert", "--input", str(text),
                             "--output", str(tmp_path / "out"), "--no-progress", "--num-shards", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not [p for p in os.listdir(tmp_path) if p.startswith(".out.prepare-")]:  # it is writing
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [err.strip()] and "interrupted (SIGINT)" in err, err
    assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".")]


@pytest.mark.parametrize("job", ["pretrain", "finetune", "ncf", "predict"])
def test_a_jobs_help_names_its_most_used_settings_and_where_the_rest_are(job):
    """Each job's --help points to ``hvd-bert config --job JOB --explain``, and every setting it
    names first is one of the job's (a key ``--set`` takes)."""
    import argparse

    from hvd_bert.cli import build_parser
    from hvd_bert.cli_args import MOST_USED
    from hvd_bert.config import JOB_CONFIGS, apply_overrides

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(sub.choices[job].format_help().split())
    assert f"hvd-bert config --job {job} --explain" in text
    cls = JOB_CONFIGS[job]
    for key in MOST_USED[job]:
        value = C_VALUES.get(key.rsplit(".", 1)[-1], "1")
        apply_overrides(cls(), [f"{key}={value}"])  # (an unknown key raises)


C_VALUES = {"model": "base", "mode": "bf16", "precision": "bf16", "lr": "0.001", "output_dir": "runs/x",
            "data": "d", "eval_data": "d", "init_checkpoint": "ckpt", "max_seq_length": "128", "stage": "1"}


def test_output_cut_short_by_its_reader_is_not_an_error():
    import subprocess
    import sys

    p = subprocess.run(f"{sys.executable} -m hvd_bert config --job pretrain --explain | head -n 1",
                       shell=True, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr and p.stdout.count("\n") == 1, p.stderr


def test_a_full_disk_names_its_mount_only_where_the_writer_named_its_file():
    """A writer that named no file (a library's own error) is not placed on / by guesswork: the
    line says which output setting's device is full."""
    import errno

    from hvd_bert.files import os_error_line

    line = os_error_line(OSError(errno.ENOSPC, "No space left on device"), "--output")
    assert line.startswith("no space left on the device --output writes to") and " on /" not in line
    named = os_error_line(OSError(errno.ENOSPC, "No space left on device", "/proc/x"), "--output")
    assert named.startswith("no space left on /proc while writing /proc/x"), named
