"""Hugging Face checkpoints in the TensorFlow model, with ``transformers`` as the oracle: the same
MLM and NSP logits as transformers' own model on the same batch, padding included."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[1]))
from hf_oracle import CONFIGS, batch, close, hf_logits, hf_model  # noqa: E402

import hvd_bert.tf  # noqa: E402,F401
import tensorflow as tf  # noqa: E402

from hvd_bert.tf.models.bert import (BertForPreTraining, build_model, load_weights,  # noqa: E402
                                     read_checkpoint_weights)


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_transformers_checkpoint_gives_the_same_logits_in_tensorflow(tmp_path, kind, fmt):
    import torch

    model = hf_model(kind)
    model.save_pretrained(tmp_path / "hf")
    if fmt == "bin":
        (tmp_path / "hf" / "model.safetensors").unlink()
        torch.save(model.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    arrays, config = read_checkpoint_weights(tmp_path / "hf")
    ids, seg, mask, pos = batch(model.config)
    ours = build_model(BertForPreTraining(config), ids.shape[1], pos.shape[1])
    load_weights(ours, arrays, source="test")
    mlm, nsp = ours({"input_ids": tf.constant(ids.numpy()), "segment_ids": tf.constant(seg.numpy()),
                     "input_mask": tf.constant(mask.numpy()),
                     "masked_lm_positions": tf.constant(pos.numpy())}, training=False)
    want_mlm, want_nsp = hf_logits(model, ids, seg, mask, pos)
    close(np.asarray(mlm)[..., : config.vocab_size], want_mlm)
    close(np.asarray(nsp), want_nsp)


def test_a_transformers_squad_model_gives_the_same_span_logits_in_tensorflow(tmp_path):
    import torch
    import transformers

    from hvd_bert.tf.models.bert import BertForQuestionAnswering, export_weights

    torch.manual_seed(6)
    hf = transformers.BertForQuestionAnswering(transformers.BertConfig(**CONFIGS["tanh"])).eval()
    hf.save_pretrained(tmp_path / "qa")
    arrays, config = read_checkpoint_weights(tmp_path / "qa")
    ids, seg, mask, _ = batch(hf.config)
    ours = build_model(BertForQuestionAnswering(config), ids.shape[1])
    load_weights(ours, arrays, source="qa")
    start, end = ours({"input_ids": tf.constant(ids.numpy()), "segment_ids": tf.constant(seg.numpy()),
                       "input_mask": tf.constant(mask.numpy())}, training=False)
    with torch.no_grad():
        want = hf(input_ids=ids, token_type_ids=seg, attention_mask=mask)
    close(np.asarray(start), want.start_logits.numpy())
    close(np.asarray(end), want.end_logits.numpy())
    assert "pooler.weight" not in export_weights(ours) and "qa_outputs.weight" in export_weights(ours)
