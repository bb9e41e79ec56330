"""Batches padded to their longest sequence (``data.padding``): the same records, the same
number of batches, less padding, reproducible from the seed, and resumable mid-epoch."""

import numpy as np

from hvd_bert.data.padding import length_grouped, trim_padding


def batches(n_batches, size, seq=64, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_batches):
        lengths = rng.integers(3, seq + 1, size)
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
        ids = (rng.integers(5, 100, (size, seq)) * mask)
        out.append({"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(mask),
                    "label_ids": np.arange(b * size, (b + 1) * size)[:, None]})  # the record's number
    return out


def test_trim_cuts_to_the_longest_sequence_rounded_up():
    b = batches(1, 4)[0]
    b["input_mask"][:, 13:] = 0
    t = trim_padding(b, 8)
    assert t["input_ids"].shape == (4, 16) and t["label_ids"].shape == (4, 1)
    assert (t["input_ids"] == b["input_ids"][:, :16]).all()
    assert trim_padding(b, 64)["input_ids"].shape == (4, 64)  # never beyond the prepared length


def test_grouping_keeps_every_record_once_and_the_number_of_batches():
    src = batches(10, 8)
    out = list(length_grouped(src, 4, (1, 0, 0)))
    assert len(out) == 10 and all(len(b["label_ids"]) == 8 for b in out)
    assert sorted(np.concatenate([b["label_ids"][:, 0] for b in out]).tolist()) == list(range(80))
    for b in out:  # each record keeps its own tokens, only its padding is cut
        for row, rec in zip(b["input_ids"], b["label_ids"][:, 0]):
            orig = src[rec // 8]["input_ids"][rec % 8]
            assert (row == orig[:len(row)]).all() and not orig[len(row):].any()
    grouped = sum(b["input_ids"].shape[1] for b in out)
    trimmed = sum(trim_padding(b)["input_ids"].shape[1] for b in src)
    assert grouped < trimmed < 64 * 10


def test_the_order_depends_on_the_seed_and_resuming_gives_the_rest():
    src = batches(12, 4)
    a = list(length_grouped(src, 6, (1, 0, 0)))
    b = list(length_grouped(src, 6, (1, 0, 0)))
    c = list(length_grouped(src, 6, (2, 0, 0)))
    ids = lambda bs: [x["label_ids"][:, 0].tolist() for x in bs]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert ids(list(length_grouped(src, 6, (1, 0, 0), start=5))) == ids(a)[5:]
