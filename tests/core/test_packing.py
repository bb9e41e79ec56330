"""Packed pretraining batches (hvd_bert.data.packing): every real token lands once, where the
model's gather indices say, and the per-sequence targets stay in the batch's order. (That the
model gives the unpacked batch's loss and gradients: tests/pt/test_packed_bert.py and the job
against transformers in tests/pt/test_training_equivalence.py.)"""

import numpy as np
import pytest

from hvd_bert.data.packing import pack_batch, row_fill


def make_batch(lengths, s=16, p=3, seed=0):
    rng = np.random.default_rng(seed)
    b = len(lengths)
    lengths = np.asarray(lengths)
    mask = (np.arange(s) < lengths[:, None]).astype(np.int32)
    ids = rng.integers(5, 100, (b, s)).astype(np.int32) * mask
    ids[:, 0] = 2  # [CLS]
    seg = ((np.arange(s) >= (lengths // 2)[:, None]) & (mask > 0)).astype(np.int32)
    pos = np.zeros((b, p), np.int32)
    w = np.zeros((b, p), np.float32)
    for i, n in enumerate(lengths):
        k = min(p, n - 1)
        pos[i, :k] = np.sort(rng.choice(np.arange(1, n), k, replace=False))
        w[i, :k] = 1
    return dict(input_ids=ids, input_mask=mask, segment_ids=seg, masked_lm_positions=pos,
                masked_lm_ids=rng.integers(5, 100, (b, p)).astype(np.int32), masked_lm_weights=w,
                next_sentence_labels=rng.integers(0, 2, (b, 1)).astype(np.int32))


def test_full_rows_stay_as_they_are():
    b = make_batch([16, 16, 16])
    p = pack_batch(b)
    for k in set(b) - {"masked_lm_positions"}:
        np.testing.assert_array_equal(p[k], b[k], err_msg=k)
    np.testing.assert_array_equal(p["masked_lm_positions"], b["masked_lm_positions"] + [[0], [16], [32]])
    np.testing.assert_array_equal(p["position_ids"], np.tile(np.arange(16), (3, 1)))
    np.testing.assert_array_equal(p["sequence_ids"], np.ones((3, 16)))
    np.testing.assert_array_equal(p["cls_positions"], [0, 16, 32])


def test_short_sequences_share_rows_first_fit_decreasing():
    # longest first: 10 -> row 0, 9 -> row 1, 6 -> row 0 (16), 5 -> row 1 (14), 2 -> row 1 (16)
    b = make_batch([5, 10, 2, 9, 6])
    p = pack_batch(b)
    assert p["input_ids"].shape == (2, 16)
    np.testing.assert_array_equal(p["cls_positions"], [16 + 9, 0, 16 + 14, 16, 10])
    np.testing.assert_array_equal(p["sequence_ids"][0], [1] * 10 + [2] * 6)
    np.testing.assert_array_equal(p["sequence_ids"][1], [1] * 9 + [2] * 5 + [3] * 2)
    np.testing.assert_array_equal(p["position_ids"][0], list(range(10)) + list(range(6)))
    assert row_fill(b) == pytest.approx(32 / 80) and row_fill(p) == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_every_token_and_target_is_where_the_indices_say(seed):
    rng = np.random.default_rng(seed)
    s = 32
    lengths = np.where(rng.random(24) < 0.5, rng.integers(2, s + 1, 24), s)
    b = make_batch(lengths, s=s, p=5, seed=seed)
    p = pack_batch(b)
    rows = len(p["input_ids"])
    assert rows <= len(lengths) and p["input_mask"].sum() == lengths.sum()
    flat = {k: p[k].reshape(-1) for k in ("input_ids", "segment_ids", "position_ids", "sequence_ids")}
    for i, n in enumerate(lengths):
        at = p["cls_positions"][i] + np.arange(n)  # a sequence's tokens are consecutive in its row
        assert len(set(at // s)) == 1
        np.testing.assert_array_equal(flat["input_ids"][at], b["input_ids"][i, :n])
        np.testing.assert_array_equal(flat["segment_ids"][at], b["segment_ids"][i, :n])
        np.testing.assert_array_equal(flat["position_ids"][at], np.arange(n))
        assert len(set(flat["sequence_ids"][at])) == 1 and flat["sequence_ids"][at[0]] > 0
        real = b["masked_lm_weights"][i] > 0
        np.testing.assert_array_equal(flat["input_ids"][p["masked_lm_positions"][i][real]],
                                      b["input_ids"][i][b["masked_lm_positions"][i][real]])
    # the sequences of a row have distinct ids; padding has id 0 and mask 0
    assert ((p["sequence_ids"] == 0) == (p["input_mask"] == 0)).all()
    for k in ("masked_lm_ids", "masked_lm_weights", "next_sentence_labels"):
        np.testing.assert_array_equal(p[k], b[k])
    assert all(p[k].dtype == b[k].dtype for k in b)
