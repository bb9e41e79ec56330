"""NCF data: MovieLens formats, leave-one-out, negatives, the synthetic generator."""

import numpy as np
import pytest

from hvd_bert.data import ncf as N
from hvd_bert.data import movielens as M
from hvd_bert.data.records import DatasetError


def test_movielens_formats_parse_alike(tmp_path):
    rows = [(1, 10, 4.0, 100), (1, 20, 3.5, 50), (2, 10, 5.0, 70), (2, 30, 1.0, 80), (2, 20, 2.0, 90)]
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" +
                                          "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows))
    (tmp_path / "ml1m").mkdir()
    dat = "".join(f"{u}::{i}::{int(r)}::{t}\n" for u, i, r, t in rows)
    (tmp_path / "ml1m" / "ratings.dat").write_text(dat)
    a = M.load_movielens(tmp_path / "ratings.csv")
    b = M.load_movielens(tmp_path / "ml1m")
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert list(a[0]) == [1, 1, 2, 2, 2] and list(a[2]) == [100, 50, 70, 80, 90]


def test_movielens_errors(tmp_path):
    with pytest.raises(DatasetError, match="no MovieLens ratings"):
        M.load_movielens(tmp_path)
    (tmp_path / "ratings.csv").write_text("user,item\n1,2\n")
    with pytest.raises(DatasetError, match="is not a MovieLens ratings file: its first line 'user,item'"):
        M.load_movielens(tmp_path / "ratings.csv")


def test_every_published_layout_is_told_apart_by_content(tmp_path):
    """ml-100k's u.data (tabs), ml-latest's ratings.csv (a header, half stars), ml-10m's
    ratings.dat: the same ratings whatever the file is called."""
    rows = [(196, 242, 3, 881250949), (186, 302, 3, 891717742), (196, 377, 1, 878887116),
            (186, 346, 1, 886397596)]
    files = {"u.data": "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows),
             "ratings.csv": "userId,movieId,rating,timestamp\n" + "".join(
                 f"{u},{i},{r - 0.5},{t}\n" for u, i, r, t in rows),
             "ratings.dat": "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows)}
    want = ([196, 186, 196, 186], [242, 302, 377, 346], [881250949, 891717742, 878887116, 886397596])
    for name, text in files.items():
        for where in (tmp_path / name, tmp_path / f"{name}.renamed.txt"):
            where.write_text(text)
            assert [list(c) for c in M.load_movielens(where)] == [*want[:2], want[2]], where
        (tmp_path / name.replace(".", "_")).mkdir()
        (tmp_path / name.replace(".", "_") / name).write_text(text)
        assert list(M.load_movielens(tmp_path / name.replace(".", "_"))[1]) == want[1]  # the folder


def test_a_malformed_line_is_named_and_skipped_only_when_asked(tmp_path):
    f = tmp_path / "u.data"
    f.write_text("1\t10\t3\t100\n1\t20\t4\n2\t10\t5\t70\n2\tx\t1\t80\n2\t30\t2\t90\n")
    with pytest.raises(DatasetError, match=r"u.data line 2: '1\\t20\\t4' is not 4 numbers separated by '\\t' "
                                           r"\(ml-100k u.data\); fix the file, or pass --skip-bad-lines"):
        M.load_movielens(f)
    said = []
    users, items, _ = M.load_movielens(f, skip_bad_lines=True, report=said.append)
    assert list(items) == [10, 10, 30] and said == [f"{f}: skipped 2 malformed line(s), the first at line 2"]
    with pytest.raises(DatasetError, match="u.data line 2"):
        N.prepare_ncf(tmp_path / "out", movielens=f)
    assert not (tmp_path / "out").exists()  # a failed check writes nothing


def test_mlperf_protocol_ranks_among_999_negatives_that_are_never_positives(tmp_path):
    meta = N.prepare_ncf(tmp_path / "d", synthetic="ml-1m", synthetic_scale=0.02, seed=1, eval_negatives=999)
    d = N.load_ncf(tmp_path / "d")
    assert meta["test_negatives"] == 999 and d.test_negatives.shape == (d.n_users, 999)
    positives = (set(zip(d.train_users.tolist(), d.train_items.tolist()))
                 | set(enumerate(d.test_items.tolist())))
    for u in range(d.n_users):
        row = d.test_negatives[u].tolist()
        assert len(set(row)) == 999 and not any((u, i) in positives for i in row)
    with pytest.raises(DatasetError, match="100 .* or 999"):
        N.prepare_ncf(tmp_path / "e", synthetic="ml-1m", synthetic_scale=0.02, eval_negatives=50)



@pytest.mark.parametrize("bad,line,what", [("2.7", 3, "item id 2.7"), ("-5", 3, "item id -5"),
                                           ("1e12", 3, r"item id 1e\+12")])
def test_movielens_ids_that_are_not_integers_are_refused_not_truncated(tmp_path, bad, line, what):
    f = tmp_path / "ratings.csv"
    f.write_text(f"userId,movieId,rating,timestamp\n1,2,5,100\n1,{bad},4,101\n2,3,3,102\n")
    with pytest.raises(DatasetError, match=rf"ratings.csv line {line}: {what} is not an integer in \[0, "
                                           rf"2147483648\) \(1 such rows\)"):
        M.load_movielens(f)
    dat = tmp_path / "ratings.dat"
    dat.write_text("1::2::5::100\n-1::3::4::101\n")
    with pytest.raises(DatasetError, match=r"ratings.dat line 2: user id -1 is not an integer"):
        M.load_movielens(dat)


def test_a_truncated_ncf_file_is_a_clear_error(tmp_path):
    N.prepare_ncf(tmp_path / "d", synthetic="ml-1m", synthetic_scale=0.02, seed=0)
    f = tmp_path / "d" / "ncf.npz"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(DatasetError, match=r"ncf.npz is 1000 bytes but dataset.json says"):
        N.load_ncf(tmp_path / "d")
    meta = (tmp_path / "d" / "dataset.json")
    import json
    m = json.loads(meta.read_text())
    del m["shards"][0]["bytes"]  # data prepared before sizes were recorded
    meta.write_text(json.dumps(m))
    with pytest.raises(DatasetError, match=r"ncf.npz is not a complete NCF data file \(BadZipFile"):
        N.load_ncf(tmp_path / "d")


def test_leave_one_out_holds_out_the_latest_and_remaps_ids():
    users = np.array([7, 7, 7, 9, 9, 5])
    items = np.array([100, 200, 300, 200, 100, 300])
    ts = np.array([3, 1, 2, 5, 4, 1])
    tu, ti, test, n_users, n_items = N.leave_one_out(users, items, ts)
    assert (n_users, n_items) == (2, 3)  # user 5 has one interaction: dropped
    # user 7 -> 0: items by time 200 (t1), 300 (t2), 100 (t3): test is 100 -> id 0
    assert list(test) == [0, 1]  # user 9 -> 1: latest is 200 -> id 1
    assert sorted(zip(tu.tolist(), ti.tolist())) == [(0, 1), (0, 2), (1, 0)]


def test_test_negatives_are_distinct_and_never_positive():
    data = N.synthetic_movielens(300, 400, 20_000, seed=1)
    tu, ti, test, n_users, n_items = N.leave_one_out(*data)
    neg = N.sample_test_negatives(tu, ti, test, n_items, 100, seed=2)
    assert neg.shape == (n_users, 100)
    assert all(len(set(row)) == 100 for row in neg.tolist())
    pos = set(zip(tu.tolist(), ti.tolist())) | set(enumerate(test.tolist()))
    assert not any((u, int(i)) in pos for u in range(n_users) for i in neg[u])


def test_train_negatives_avoid_positives_and_keep_the_ratio():
    data = N.synthetic_movielens(200, 300, 10_000, seed=3)
    tu, ti, _, _, n_items = N.leave_one_out(*data)
    u, i, y = N.sample_train_negatives(tu, ti, n_items, 4, np.random.default_rng(0))
    assert len(u) == 5 * len(tu) and y.sum() == len(tu)
    pos = set(zip(tu.tolist(), ti.tolist()))
    assert not any((a, b) in pos for a, b, lab in zip(u.tolist(), i.tolist(), y.tolist()) if lab == 0)
    u2, i2, _ = N.sample_train_negatives(tu, ti, n_items, 4, np.random.default_rng(1))
    assert not np.array_equal(i, i2)  # fresh negatives each epoch


def test_synthetic_data_is_skewed_and_learnable():
    users, items, ts, logit = N.synthetic_movielens(600, 800, 60_000, seed=0, return_logits=True)
    assert np.bincount(users).min() >= 20
    c = np.sort(np.bincount(items, minlength=800))
    assert c[-80:].sum() / c.sum() > 0.25  # the top 10% of items take a large share
    tu, ti, test, n_users, n_items = N.leave_one_out(users, items, ts)
    neg = N.sample_test_negatives(tu, ti, test, n_items, 100, seed=0)
    cand = np.c_[test, neg]  # ids are unchanged here: users and items are already 0..n-1

    def hr10(scores):
        return np.mean((scores > scores[:, :1]).sum(1) < 10)

    pop = np.bincount(ti, minlength=n_items).astype(float)
    hr_pop = hr10(pop[cand])
    hr_oracle = hr10(logit(np.arange(n_users)[:, None], cand))
    # the planted preferences rank the held-out item far better than popularity does:
    # there is signal beyond popularity for a model to learn, and popularity is a real baseline
    assert 0.2 < hr_pop < 0.8 and hr_oracle > hr_pop + 0.15


def test_prepare_and_load_round_trip(tmp_path):
    meta = N.prepare_ncf(tmp_path / "d", synthetic="ml-1m", synthetic_scale=0.05, seed=4)
    d = N.load_ncf(tmp_path / "d")
    assert (d.n_users, d.n_items) == (meta["n_users"], meta["n_items"])
    assert len(d.test_items) == d.n_users and d.test_negatives.shape == (d.n_users, 100)
    with pytest.raises(DatasetError, match="already holds prepared data"):
        N.prepare_ncf(tmp_path / "d", synthetic="ml-1m", synthetic_scale=0.05)
