"""Hugging Face checkpoints with ``transformers`` as the oracle (a test dependency): random BERTs
of odd sizes saved with ``save_pretrained`` (safetensors and .bin) load into hvd_bert's PyTorch
BERT with the same MLM and NSP logits, padding included; hvd_bert -> ``--to hf`` ->
``from_pretrained`` gives the same logits again with no missing or unexpected weights."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parents[1]))
from hf_oracle import CONFIGS, batch, close, hf_logits, hf_model  # noqa: E402

from hvd_bert.weights.hf import read_hf_folder, write_hf_folder  # noqa: E402
from hvd_bert.pt.models.bert import (BertForPreTraining, BertForSequenceClassification,  # noqa: E402
                                     export_weights, load_weights, read_checkpoint_weights)

def ours_logits(arrays, config, ids, seg, mask, pos):
    model = BertForPreTraining(config).eval()
    load_weights(model, arrays, source="test")
    with torch.no_grad():
        mlm, nsp = model(ids, seg, mask, pos)
    return mlm[..., : config.vocab_size].numpy(), nsp.numpy()


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_transformers_checkpoint_gives_the_same_logits(tmp_path, kind, fmt):
    model = hf_model(kind)
    model.save_pretrained(tmp_path / "hf")
    if fmt == "bin":  # the older layout: torch.save of the state_dict (transformers 5 writes safetensors)
        (tmp_path / "hf" / "model.safetensors").unlink()
        torch.save(model.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    arrays, config = read_checkpoint_weights(tmp_path / "hf")
    assert config.vocab_size == CONFIGS[kind]["vocab_size"] and config.num_heads == 3
    assert config.gelu == ("none" if kind == "erf" else "tanh")
    b = batch(model.config)
    for ours, theirs in zip(ours_logits(arrays, config, *b), hf_logits(model, *b)):
        close(ours, theirs)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_the_round_trip_to_hf_loads_in_transformers_without_warnings(tmp_path, kind):
    model = hf_model(kind, seed=2)
    model.save_pretrained(tmp_path / "hf")
    arrays, config = read_hf_folder(tmp_path / "hf")
    ours = BertForPreTraining(config).eval()
    load_weights(ours, arrays, source="test")
    out = write_hf_folder(tmp_path / "back", export_weights(ours), config)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert len(set(modes.values())) == 1 and modes["model.safetensors"] & 0o044, modes  # as any file here
    again, info = transformers.BertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    b = batch(model.config, seed=3)
    for a, w in zip(hf_logits(again.eval(), *b), hf_logits(model, *b)):
        close(a, w)
    auto = transformers.AutoModel.from_pretrained(out)  # the encoder alone loads as well
    assert isinstance(auto, transformers.BertModel)


def test_a_bert_model_without_heads_initialises_fine_tuning_and_pretraining_with_a_warning(tmp_path, capsys):
    torch.manual_seed(0)
    encoder = transformers.BertModel(transformers.BertConfig(**CONFIGS["erf"])).eval()
    encoder.save_pretrained(tmp_path / "enc")
    arrays, config = read_checkpoint_weights(tmp_path / "enc")
    clf = BertForSequenceClassification(config, 3)
    load_weights(clf, arrays, source="enc")  # no warning: a classifier needs no pretraining heads
    np.testing.assert_array_equal(clf.layers[1].query.weight.detach().numpy(),
                                  encoder.encoder.layer[1].attention.self.query.weight.detach().numpy())
    assert "warning" not in capsys.readouterr().err
    load_weights(BertForPreTraining(config), arrays, source="enc")
    assert "has no pretraining heads" in capsys.readouterr().err


def test_a_fine_tuned_classifier_exports_as_bert_for_sequence_classification(tmp_path):
    torch.manual_seed(4)
    hf = transformers.BertForSequenceClassification(transformers.BertConfig(**CONFIGS["tanh"], num_labels=3))
    hf.save_pretrained(tmp_path / "clf")
    arrays, config = read_hf_folder(tmp_path / "clf")
    out = write_hf_folder(tmp_path / "back", arrays, config)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    again, info = transformers.BertForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids, seg, mask, _ = batch(hf.config)
    with torch.no_grad():
        close(again.eval()(input_ids=ids, token_type_ids=seg, attention_mask=mask).logits.numpy(),
              hf.eval()(input_ids=ids, token_type_ids=seg, attention_mask=mask).logits.numpy())
    named = write_hf_folder(tmp_path / "named", arrays, config, labels=["neg", "neu", "pos"])  # data's names
    assert transformers.AutoConfig.from_pretrained(named).id2label == {0: "neg", 1: "neu", 2: "pos"}


@pytest.mark.parametrize("damage,match", [
    ("truncate", "cannot be read .* truncated or not safetensors"),
    ("activation", "hidden_act 'relu' is not supported"),
    ("shape", "do not fit this model|rows, config.json's vocab_size|does not match config.json"),
])
def test_bad_hf_folders_are_clear_errors(tmp_path, damage, match):
    from hvd_bert.weights.portable import WeightsError

    hf_model("erf").save_pretrained(tmp_path / "hf")
    st, cfg = tmp_path / "hf" / "model.safetensors", tmp_path / "hf" / "config.json"
    if damage == "truncate":
        st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    elif damage == "activation":
        cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), hidden_act="relu")))
    else:
        cfg.write_text(json.dumps(dict(json.loads(cfg.read_text()), vocab_size=999)))
    with pytest.raises(WeightsError, match=match):
        arrays, config = read_checkpoint_weights(tmp_path / "hf")
        load_weights(BertForPreTraining(config), arrays, source=str(tmp_path / "hf"))


def test_convert_to_hf_from_the_command_line(tmp_path):
    """An export without a vocabulary, or with one of another size, is refused and writes nothing;
    with its own it loads in transformers; an existing folder is kept unless --overwrite, which
    replaces it whole."""
    hf_model("tanh").save_pretrained(tmp_path / "hf")

    def convert(*extra):
        return subprocess.run([sys.executable, "-m", "hvd_bert", "convert", str(tmp_path / "hf"), "--to",
                               "hf", "--output", str(tmp_path / "out"), *extra], capture_output=True,
                              text=True, timeout=300)
    res = convert()
    assert res.returncode == 2 and "no vocab.txt for" in res.stderr and not (tmp_path / "out").exists()
    whole = Path(__file__).parents[1] / "data" / "stdlib-uncased-1500-vocab.txt"
    res = convert("--vocab", str(whole))  # (another model's size: one token per embedding row)
    assert res.returncode == 2 and "has 1500 tokens, the model 203" in res.stderr, res.stderr
    vocab = tmp_path / "vocab.txt"  # (the model's 203 rows: the vocabulary's first 203 tokens)
    vocab.write_text("".join(line + "\n" for line in whole.read_text().splitlines()[:203]))
    res = convert("--vocab", str(vocab))
    assert res.returncode == 0, res.stderr
    again, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert (tmp_path / "out" / "vocab.txt").read_bytes() == vocab.read_bytes()
    (tmp_path / "out" / "stale.txt").write_text("from before")
    res = convert("--vocab", str(vocab))
    assert res.returncode == 2 and "is not empty" in res.stderr  # nothing overwritten
    assert (tmp_path / "out" / "stale.txt").is_file()
    res = convert("--vocab", str(vocab), "--overwrite")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "out" / "stale.txt").exists()
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_an_nvidia_deeplearningexamples_checkpoint_gives_the_same_logits(tmp_path):
    """NVIDIA's PyTorch BERT saves ``{"model": state_dict}`` with Hugging Face's names (its
    intermediate layer is ``dense_act``) beside a Google-style bert_config.json; its GELU is the
    erf form, as transformers' "gelu"."""
    model = hf_model("erf", seed=5)
    c = CONFIGS["erf"]
    state = {k.replace("intermediate.dense.", "intermediate.dense_act."): v
             for k, v in model.state_dict().items()}
    (tmp_path / "nv").mkdir()
    torch.save({"model": state, "epoch": 3}, tmp_path / "nv" / "ckpt_8601.pt")
    (tmp_path / "nv" / "bert_config.json").write_text(json.dumps({
        "vocab_size": c["vocab_size"], "hidden_size": c["hidden_size"],
        "num_hidden_layers": c["num_hidden_layers"], "num_attention_heads": c["num_attention_heads"],
        "intermediate_size": c["intermediate_size"],
        "hidden_act": "gelu", "max_position_embeddings": c["max_position_embeddings"], "type_vocab_size": 2}))
    arrays, config = read_checkpoint_weights(tmp_path / "nv" / "ckpt_8601.pt")
    assert config.gelu == "none"
    b = batch(model.config)
    for ours, theirs in zip(ours_logits(arrays, config, *b), hf_logits(model, *b)):
        close(ours, theirs)


def test_a_transformers_squad_model_gives_the_same_span_logits_and_round_trips(tmp_path):
    """``BertForQuestionAnswering`` (``qa_outputs``, no pooler) is read with its span head, scores
    the same start and end logits as transformers' own, and exports back as that architecture."""
    from hvd_bert.pt.models.bert import BertForQuestionAnswering

    torch.manual_seed(5)
    hf = transformers.BertForQuestionAnswering(transformers.BertConfig(**CONFIGS["erf"])).eval()
    hf.save_pretrained(tmp_path / "qa")
    arrays, config = read_checkpoint_weights(tmp_path / "qa")
    ours = BertForQuestionAnswering(config).eval()
    load_weights(ours, arrays, source="qa")
    ids, seg, mask, _ = batch(hf.config)
    with torch.no_grad():
        start, end = ours(ids, seg, mask)
        want = hf(input_ids=ids, token_type_ids=seg, attention_mask=mask)
    close(start.numpy(), want.start_logits.numpy())
    close(end.numpy(), want.end_logits.numpy())
    out = write_hf_folder(tmp_path / "back", export_weights(ours), config)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    again, info = transformers.BertForQuestionAnswering.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # a pretraining checkpoint starts a span model: encoder loaded, span head fresh, pooler dropped
    pre = BertForPreTraining(config)
    fresh = BertForQuestionAnswering(config)
    load_weights(fresh, export_weights(pre), source="pretrained")
    np.testing.assert_array_equal(fresh.layers[0].query.weight.detach().numpy(),
                                  pre.layers[0].query.weight.detach().numpy())
