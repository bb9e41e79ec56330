"""NCF under real Horovod: HR@10 computed by 2 ranks equals 1 rank's for the same model (both
frameworks), and `hvd-bert ncf` trains NeuMF on synthetic data to an HR@10 well above the
popularity baseline in a short run, stopping early at a target."""

import json
import subprocess
import sys

import pytest

from hvd_bert.cluster import launch
from hvd_bert.evaluation.ncf import eval_users, hit_rate_ndcg, popularity_scores
from hvd_bert.data.ncf import load_ncf


@pytest.fixture(scope="module")
def ncf_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("ncf") / "data"
    subprocess.run([sys.executable, "-m", "hvd_bert", "prepare-ncf", "--output", str(out), "--scale", "0.1"],
                   check=True, capture_output=True, timeout=300)
    return out


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_two_ranks_and_one_rank_give_the_same_hit_rate(run_ranks, ncf_data, framework):
    two = run_ranks("ncf_eval.py", framework, ncf_data, np=2, tag="2")
    one = run_ranks("ncf_eval.py", framework, ncf_data, np=1, tag="1")
    n_users = load_ncf(ncf_data).n_users
    assert two[0]["checksum"] == two[1]["checksum"] == one[0]["checksum"]  # the same model
    assert [r["local_users"] for r in two] == [(n_users + 1) // 2, n_users // 2]
    assert two[0]["users"] == two[1]["users"] == one[0]["users"] == n_users
    assert two[0]["hr"] == two[1]["hr"] == one[0]["hr"]
    assert two[0]["ndcg"] == pytest.approx(one[0]["ndcg"], rel=1e-12)
    assert 0.0 < one[0]["hr"] < 1.0


def ncf(framework, data, out, *extra):
    res = launch.run(["-m", "hvd_bert", "ncf", "--framework", framework, "--set", f"data={data}",
                      "--set", f"train.output_dir={out}", "--set", "model.factors=32",
                      "--set", "model.layers=[64, 32]", "--set", "train.batch.local_batch_size=4096",
                      "--set", "train.optim.lr=0.01", *extra], np=2, timeout=600)
    assert res.ok, res.explain()
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [e for e in evals if "hr@10" in e], res.stdout


@pytest.mark.parametrize("framework", ["pt", "tf"])
def test_training_beats_the_popularity_baseline(ncf_data, tmp_path, framework):
    data = load_ncf(ncf_data)
    users = eval_users(data.n_users, 0, 1)
    popularity = hit_rate_ndcg(popularity_scores(data, users), 10)[0] / len(users)
    evals, stdout = ncf(framework, ncf_data, tmp_path / "run", "--set", "epochs=6")
    assert [e["epoch"] for e in evals] == [1, 2, 3, 4, 5, 6]
    best = max(e["hr@10"] for e in evals)
    assert best > popularity + 0.15, (best, popularity)
    assert "best HR@10" in stdout
    # the best model by HR@10 is kept as NCF's best checkpoint, beside the run's own
    record = json.loads((tmp_path / "run" / "best.json").read_text())
    assert record["metric"] == "hr@10" and record["score"] == best and record["greater_is_better"]
    step = next(e["step"] for e in evals if e["hr@10"] == best)
    assert record["step"] == step and [p.name for p in (tmp_path / "run" / "best").glob("ckpt-*")] == [
        f"ckpt-{step:08d}.shards"]  # (2 ranks: sharded by default)


def test_training_stops_at_the_target_hit_rate(ncf_data, tmp_path):
    evals, stdout = ncf("pt", ncf_data, tmp_path / "run", "--set", "epochs=20", "--set", "target_hr=0.55")
    assert evals[-1]["hr@10"] >= 0.55 and len(evals) < 20
    assert "target HR@10 0.55 reached at epoch" in stdout


@pytest.mark.parametrize("setting, words", [
    ("top_k=500", "top_k=500, but each user's held-out item is ranked among 101 candidates"),
    ("num_negatives=1000000", "num_negatives=1000000 negatives per positive, but the data has")])
def test_settings_the_data_cannot_serve_are_refused_on_every_rank(setting, words, ncf_data, tmp_path):
    res = launch.run(["-m", "hvd_bert", "ncf", "--set", f"data={ncf_data}", "--set",
                      f"train.output_dir={tmp_path / 'run'}", "--set", setting], np=2, timeout=300)
    lines = [ln for ln in res.stderr.splitlines() if "hvd-bert ncf:" in ln]
    assert not res.ok and len(lines) == 2, res.explain()
    assert all(words in ln for ln in lines)
    assert not (tmp_path / "run").exists()
