"""Google TF1 checkpoints with Google's own ``modeling.py`` (PyPI ``bert-tensorflow`` 1.0.4) as the
oracle, run in its own process (tests/google_oracle.py): a checkpoint Google's BertModel wrote
loads here, in TensorFlow and in PyTorch (which reads it through a TensorFlow process), with
the same sequence and pooled outputs; ``--to google`` loads back into Google's model with the
same outputs."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("bert")  # bert-tensorflow; modeling.py itself imports only in the oracle process

from closeness import assert_close
import hvd_bert.tf  # noqa: E402,F401
import tensorflow as tf  # noqa: E402

ORACLE = Path(__file__).parents[1] / "google_oracle.py"


def oracle(*args):
    res = subprocess.run([sys.executable, str(ORACLE), *map(str, args)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.fixture(scope="module")
def google(tmp_path_factory):
    out = tmp_path_factory.mktemp("google") / "uncased_L-2_H-48_A-3"
    oracle("make", out)
    return out


def close(a, b):
    """Worst case 0.015 of the bound, margin 65x (tests/bounds/MEASURED.md, 8 seeds, Zen 4)."""
    assert_close(a, b, rtol=1e-5, atol=2e-5 * np.abs(b).max(), site="tf/google_ckpt::close")


def tf_outputs(arrays, config, batch):
    from hvd_bert.tf.models.bert import BertForPreTraining, build_model, load_weights

    model = build_model(BertForPreTraining(config), batch["input_ids"].shape[1])
    load_weights(model, arrays, source="google")
    x = model.encode(tf.constant(batch["input_ids"]), tf.constant(batch["segment_ids"]),
                     tf.constant(batch["input_mask"]), training=False)
    return np.asarray(x), np.asarray(model.pool(x))


def pt_outputs(arrays, config, batch):
    import torch

    from hvd_bert.pt.models.bert import BertForPreTraining, load_weights

    model = BertForPreTraining(config).eval()
    load_weights(model, arrays, source="google")
    t = {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}
    with torch.no_grad():
        x = model.encode(t["input_ids"], t["segment_ids"], t["input_mask"])
        return x.numpy(), model.pool(x).numpy()


@pytest.mark.parametrize("framework", ["tf", "pt"])
def test_a_checkpoint_of_googles_bert_model_gives_the_same_outputs(google, framework):
    if framework == "tf":
        from hvd_bert.tf.models.bert import read_checkpoint_weights
    else:
        from hvd_bert.pt.models.bert import read_checkpoint_weights
    arrays, config = read_checkpoint_weights(google)
    assert config.gelu == "tanh" and config.vocab_size == 1001 and config.num_heads == 3
    assert "mlm_bias" not in arrays  # BertModel alone: no pretraining heads in this checkpoint
    batch, want = dict(np.load(google / "batch.npz")), np.load(google / "outputs.npz")
    seq, pooled = (tf_outputs if framework == "tf" else pt_outputs)(arrays, config, batch)
    mask = batch["input_mask"].astype(bool)  # padded positions' outputs are not defined alike
    close(seq[mask], want["sequence"][mask])
    close(pooled, want["pooled"])


def test_to_google_loads_back_into_googles_model(google, tmp_path):
    from hvd_bert.tf.google_ckpt import write_google
    from hvd_bert.tf.models.bert import read_checkpoint_weights

    arrays, config = read_checkpoint_weights(google)
    out = write_google(tmp_path / "back", arrays, config)
    oracle("outputs", out, google / "batch.npz", tmp_path / "again.npz")
    again, want = np.load(tmp_path / "again.npz"), np.load(google / "outputs.npz")
    assert_close(again["pooled"], want["pooled"], rtol=1e-6, atol=1e-6,
                 site="tf/google_ckpt::test_to_google_loads_back_into_googles_model")
    assert_close(again["sequence"], want["sequence"], rtol=1e-6, atol=1e-6,
                 site="tf/google_ckpt::test_to_google_loads_back_into_googles_model")


def test_a_truncated_google_checkpoint_is_a_clear_error(google, tmp_path):
    import shutil

    from hvd_bert.weights.portable import WeightsError
    from hvd_bert.tf.models.bert import read_checkpoint_weights

    bad = tmp_path / "bad"
    shutil.copytree(google, bad)
    data = next(bad.glob("*.data-*"))
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(WeightsError, match="cannot read the checkpoint .*bert_model.ckpt"):
        read_checkpoint_weights(bad)
