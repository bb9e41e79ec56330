"""NCF (neural collaborative filtering) data, framework-free and vectorised (numpy).

* MovieLens ratings in their published formats (``data.movielens``).
* Implicit feedback as in He et al. 2017 and NVIDIA's NCF: every rating is a positive, ids are
  remapped to 0..n-1, each user's interactions are sorted by time and the latest is the
  leave-one-out test item, ranked among distinct sampled negatives that are not among the
  user's positives: 100 (the NCF paper's and NVIDIA's protocol) or 999 (MLPerf's), chosen
  when the data is prepared.
* A synthetic MovieLens-like generator with planted low-rank preferences and a Zipf-like
  popularity skew, at the sizes of ml-1m and ml-20m, so HR@10 is learnable without downloads.
* Training negatives (4 per positive by default) sampled each epoch, rejection-sampled in
  vectorised rounds.

A prepared folder holds ``ncf.npz`` and the ``dataset.json`` sidecar.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from hvd_bert.config.base import ConfigError
from hvd_bert.files import atomic_write
from hvd_bert.data.movielens import load_movielens
from hvd_bert.data.records import DatasetError
from hvd_bert.data.sidecar import read_sidecar, write_sidecar

__all__ = ["SYNTHETIC_PRESETS", "NCFData", "load_movielens", "synthetic_movielens", "leave_one_out",
           "sample_test_negatives", "sample_train_negatives", "epoch_keys", "permuted", "epoch_pairs",
           "prepare_ncf", "load_ncf", "EVAL_PROTOCOLS", "EpochData"]

KIND = "ncf"
# name: (users, items, interactions) of the published data sets
SYNTHETIC_PRESETS = {"ml-1m": (6040, 3706, 1_000_209), "ml-20m": (138_493, 26_744, 20_000_263)}


@dataclass
class NCFData:
    train_users: np.ndarray      # int32 [n_train]
    train_items: np.ndarray      # int32 [n_train]
    test_items: np.ndarray       # int32 [n_users]: the held-out item of user u
    test_negatives: np.ndarray   # int32 [n_users, 100 or 999]: the evaluation protocol's negatives
    n_users: int
    n_items: int
    user_ids: np.ndarray | None = None  # the input's own id of user u (None: data prepared before)
    item_ids: np.ndarray | None = None  # the input's own id of item i


# ----------------------------------------------------------------------------- synthetic
def synthetic_movielens(n_users: int, n_items: int, n_interactions: int, *, dim: int = 16,
                        taste: float = 2.5, popularity: float = 1.0, min_per_user: int = 20,
                        seed: int = 0, batch: int = 2048, return_logits: bool = False):
    """MovieLens-like implicit data: user u interacts with items drawn without replacement with
    probability proportional to ``exp(taste * <p_u, q_i> + popularity * b_i)``, where p, q are
    random unit-variance factors of rank ``dim`` and b_i = -log(i+1) of a random popularity rank
    (Zipf-like). Activity per user is log-normal (at least ``min_per_user``), scaled to about
    ``n_interactions``. Timestamps are random, so the held-out item is a random interaction.
    With ``return_logits`` a function ``(users, items) -> planted logit`` is returned too."""
    if n_users < 2 or n_items < min_per_user + 101:
        raise ValueError(f"need at least 2 users and {min_per_user + 101} items, got {n_users}, {n_items}")
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n_users, dim)).astype(np.float32) / np.sqrt(dim)
    q = rng.normal(size=(n_items, dim)).astype(np.float32)
    bias = -np.log1p(rng.permutation(n_items)).astype(np.float32)
    act = rng.lognormal(0.0, 1.0, size=n_users)
    counts = np.maximum(min_per_user, np.round(act / act.sum() * n_interactions)).astype(np.int64)
    counts = np.minimum(counts, n_items // 2)  # MovieLens' most active users rate ~60% of ml-1m
    users, items = [], []
    for lo in range(0, n_users, batch):
        hi = min(lo + batch, n_users)
        logits = taste * (p[lo:hi] @ q.T) + popularity * bias
        keys = logits + rng.gumbel(size=logits.shape).astype(np.float32)  # Gumbel top-k sampling
        order = np.argsort(-keys, axis=1)
        for u in range(lo, hi):
            k = counts[u]
            users.append(np.full(k, u, dtype=np.int64))
            items.append(order[u - lo, :k].astype(np.int64))
    users, items = np.concatenate(users), np.concatenate(items)
    ts = rng.integers(0, 2**31 - 1, size=len(users))
    if return_logits:  # the planted preference, for checking what is learnable
        return users, items, ts, lambda u, i: taste * np.sum(p[u] * q[i], -1) + popularity * bias[i]
    return users, items, ts


# ----------------------------------------------------------------------------- splits, negatives
def _keys(users: np.ndarray, items: np.ndarray, n_items: int) -> np.ndarray:
    return users.astype(np.int64) * n_items + items.astype(np.int64)


def leave_one_out(users: np.ndarray, items: np.ndarray, ts: np.ndarray, ids: bool = False):
    """Remap ids, drop repeated (user, item) pairs, and hold out each user's latest
    interaction. Returns ``(train_users, train_items, test_items, n_users, n_items)``, and with
    ``ids`` the input's own ids of the users and items by their new index; users with fewer than
    2 interactions are dropped."""
    raw_users, u = np.unique(users, return_inverse=True)
    raw_items, i = np.unique(items, return_inverse=True)
    order = np.lexsort((i, ts, u))  # by user, then time, then item
    u, i = u[order], i[order]
    keep = np.ones(len(u), dtype=bool)
    n_items = int(i.max()) + 1
    _, first = np.unique(_keys(u, i, n_items), return_index=True)
    dup = np.ones(len(u), dtype=bool)
    dup[first] = False
    keep &= ~dup  # the earliest of repeated pairs stays
    u, i = u[keep], i[keep]
    counts = np.bincount(u)
    ok_users = np.flatnonzero(counts >= 2)
    if len(ok_users) == 0:
        raise DatasetError("no user has two or more interactions: nothing to hold out")
    remap = np.full(len(counts), -1)
    remap[ok_users] = np.arange(len(ok_users))
    sel = remap[u] >= 0
    u, i = remap[u[sel]], i[sel]
    last = np.r_[np.flatnonzero(np.diff(u)), len(u) - 1]  # each user's latest interaction
    is_test = np.zeros(len(u), dtype=bool)
    is_test[last] = True
    out = (u[~is_test].astype(np.int32), i[~is_test].astype(np.int32), i[is_test].astype(np.int32),
           len(ok_users), n_items)
    return (*out, raw_users[ok_users], raw_items[:n_items]) if ids else out


def _positive_lookup(users, items, n_items):
    return np.unique(_keys(users, items, n_items))


def _is_positive(lookup: np.ndarray, users, items, n_items) -> np.ndarray:
    """Whether each (user, item) is in ``lookup`` (sorted keys). The queries are sorted first
    (with their index packed into the low bits, a plain integer sort): a binary search over
    sorted queries walks memory in order, 2-3x faster than over random ones."""
    k = _keys(np.asarray(users), np.asarray(items), n_items)
    shape, k = k.shape, k.ravel()
    n = len(k)
    if n == 0 or len(lookup) == 0:
        return np.zeros(shape, dtype=bool)
    ib = max(1, int(n - 1).bit_length())
    if int(k.max()) >= 1 << (62 - ib):  # too wide to pack: search in the given order
        return (lookup[np.minimum(np.searchsorted(lookup, k), len(lookup) - 1)] == k).reshape(shape)
    packed = np.sort((k << ib) | np.arange(n, dtype=np.int64))
    ks, idx = packed >> ib, packed & ((1 << ib) - 1)
    out = np.empty(n, dtype=bool)
    out[idx] = lookup[np.minimum(np.searchsorted(lookup, ks), len(lookup) - 1)] == ks
    return out.reshape(shape)


def sample_test_negatives(train_users, train_items, test_items, n_items: int, num: int = 100,
                          seed: int = 0) -> np.ndarray:
    """``[n_users, num]`` distinct items per user, none of them a positive (train or test)."""
    n_users = len(test_items)
    users_all = np.r_[train_users, np.arange(n_users)]
    items_all = np.r_[train_items, test_items]
    lookup = _positive_lookup(users_all, items_all, n_items)
    max_pos = np.bincount(users_all, minlength=n_users).max()
    if n_items - max_pos < num:
        raise DatasetError(f"a user has {max_pos} positives among {n_items} items: fewer than {num} "
                           f"items are left to sample negatives from")
    rng = np.random.default_rng(seed)
    neg = rng.integers(0, n_items, size=(n_users, num))
    rows = np.arange(n_users)
    while len(rows):  # redraw the rejected entries of the rows that still have any
        sub = neg[rows]
        bad = _is_positive(lookup, rows[:, None].repeat(num, 1), sub, n_items)
        order = np.argsort(sub, axis=1, kind="stable")
        srt = np.take_along_axis(sub, order, axis=1)
        dup_sorted = np.zeros_like(bad)
        dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]
        dup = np.zeros_like(bad)
        np.put_along_axis(dup, order, dup_sorted, axis=1)  # every repeat after the first
        bad |= dup
        sub[bad] = rng.integers(0, n_items, size=int(bad.sum()))
        neg[rows] = sub
        rows = rows[bad.any(axis=1)]
    return neg.astype(np.int32)


def sample_train_negatives(train_users, train_items, n_items: int, num_negatives: int = 4,
                           rng: np.random.Generator | None = None, lookup: np.ndarray | None = None):
    """One epoch of training pairs: every positive, plus ``num_negatives`` sampled negatives per
    positive (not among the user's training positives), shuffled.
    Returns ``(users, items, labels)``."""
    rng = rng or np.random.default_rng()
    lookup = _positive_lookup(train_users, train_items, n_items) if lookup is None else lookup
    nu = np.repeat(train_users, num_negatives)
    ni = rng.integers(0, n_items, size=len(nu))
    todo = np.flatnonzero(_is_positive(lookup, nu, ni, n_items))
    while len(todo):  # redraw only the rejected ones
        ni[todo] = rng.integers(0, n_items, size=len(todo))
        todo = todo[_is_positive(lookup, nu[todo], ni[todo], n_items)]
    users = np.r_[train_users, nu].astype(np.int32)
    items = np.r_[train_items, ni].astype(np.int32)
    labels = np.r_[np.ones(len(train_users), np.float32), np.zeros(len(nu), np.float32)]
    perm = rng.permutation(len(users))
    return users[perm], items[perm], labels[perm]


# ----------------------------------------------------------------------------- one rank's epoch
# Each epoch's training pairs are every positive and ``num_negatives`` negatives per positive,
# in a shuffled order. Both the order and the negatives come from counter-based functions of
# (seed, epoch, position), not from one generator run over the whole epoch, so a rank computes
# only the pairs it trains on (1/P of the epoch's time and memory), anywhere in the epoch (a
# resumed run starts mid-epoch without redoing the rest), and the epoch is the same set of
# pairs in the same order for any number of ranks.
_U = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic): a well-mixed hash."""
    with np.errstate(over="ignore"):
        z = x + _U(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
        return z ^ (z >> _U(31))


def epoch_keys(seed: int, epoch: int) -> np.ndarray:
    """The keys of one epoch's order (``permuted``) and negatives (the fifth)."""
    return np.random.default_rng([seed, epoch, 0x4E4346]).integers(0, 2**63, size=5, dtype=np.uint64)


def permuted(positions: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """``pi(positions)`` for a pseudo-random permutation ``pi`` of ``[0, n)`` keyed by ``keys``:
    on ``bits``-bit values (the fewest that cover ``n``) three rounds of multiplying by an odd
    number and adding a key (mod ``2^bits``), each followed by a right xor-shift, all
    bijections; a value that lands at or above ``n`` walks its cycle until it is back below
    (fewer than 2 steps on average), so ``pi`` is a bijection of ``[0, n)``."""
    bits = max(2, int(n - 1).bit_length())
    mask, shift = _U((1 << bits) - 1), _U(max(1, bits // 2))
    mults = [_U((int(k) | 1) & ((1 << bits) - 1)) for k in keys[:3]]
    adds = [_U(int(k) >> 7) & mask for k in keys[1:4]]
    out = np.asarray(positions, dtype=np.uint64).copy()
    todo = np.arange(len(out))
    v = out
    with np.errstate(over="ignore"):
        while len(todo):
            v = out[todo] if len(todo) < len(out) else out
            for m, c in zip(mults, adds):
                v = (v * m + c) & mask
                v ^= v >> shift
            out[todo] = v
            todo = todo[v >= _U(n)]
    return out.astype(np.int64)


def epoch_pairs(train_users: np.ndarray, train_items: np.ndarray, n_items: int, num_negatives: int,
                positions: np.ndarray, keys: np.ndarray, lookup: np.ndarray):
    """``(users, items, labels)`` at ``positions`` of an epoch's shuffled training pairs (see
    above): pair ``pi(p)`` is positive ``pi(p)`` if it is below the number of positives, else
    negative number ``q = pi(p) - positives``, for the user of positive ``q // num_negatives``,
    an item drawn by hashing ``q`` (and again, with the next counter, while it is one of the
    user's training positives)."""
    n_pos = len(train_users)
    idx = permuted(positions, n_pos * (1 + num_negatives), keys)
    is_pos = idx < n_pos
    q = np.where(is_pos, 0, idx - n_pos)
    owner = np.where(is_pos, idx, q // num_negatives)
    users = train_users[owner].astype(np.int32)
    items = train_items[owner].astype(np.int64)
    neg = np.flatnonzero(~is_pos)
    base = _mix(q[neg].astype(np.uint64) ^ keys[4])
    todo, attempt = np.arange(len(neg)), 0
    while len(todo):  # redraw only the rejected ones, each with its own next counter
        with np.errstate(over="ignore"):
            draw = (_mix(base[todo] + _U(attempt)) % _U(n_items)).astype(np.int64)
        items[neg[todo]] = draw
        todo = todo[_is_positive(lookup, users[neg[todo]], draw, n_items)]
        attempt += 1
    return users, items.astype(np.int32), is_pos.astype(np.float32)


# ----------------------------------------------------------------------------- files
EVAL_PROTOCOLS = {100: "the NCF paper's and NVIDIA's (HR@10 about 0.96 on ml-20m in NVIDIA's README)",
                  999: "MLPerf's (HR@10 target 0.635 on ml-20m)"}


def prepare_ncf(output_dir: str | Path, *, movielens: str | Path | None = None, synthetic: str | None = None,
                synthetic_scale: float = 1.0, seed: int = 0, overwrite: bool = False,
                eval_negatives: int = 100, skip_bad_lines: bool = False, report=None) -> dict:
    """Prepare ``output_dir/ncf.npz`` from a MovieLens file or a synthetic preset, each user's
    held-out item to be ranked among ``eval_negatives`` sampled negatives (:data:`EVAL_PROTOCOLS`)."""
    out = Path(output_dir)
    if eval_negatives not in EVAL_PROTOCOLS:
        raise DatasetError(f"eval_negatives must be 100 (NCF paper, NVIDIA) or 999 (MLPerf), "
                           f"got {eval_negatives}")
    if (out / "dataset.json").exists() and not overwrite:
        raise DatasetError(f"{out} already holds prepared data; pass --overwrite or another folder")
    if (movielens is None) == (synthetic is None):
        raise DatasetError("give exactly one of a MovieLens ratings file or a synthetic preset")
    if synthetic is not None:
        if synthetic not in SYNTHETIC_PRESETS:
            raise DatasetError(f"unknown synthetic preset {synthetic!r}; choose {sorted(SYNTHETIC_PRESETS)}")
        nu, ni, n = SYNTHETIC_PRESETS[synthetic]
        nu, n = max(2, int(nu * synthetic_scale)), int(n * synthetic_scale)
        users, items, ts = synthetic_movielens(nu, ni, n, seed=seed)
        source = f"synthetic {synthetic} x{synthetic_scale} (seed {seed})"
    else:
        users, items, ts = load_movielens(movielens, skip_bad_lines, report)
        source = str(Path(movielens).name)
    tu, ti, test, n_users, n_items, user_ids, item_ids = leave_one_out(users, items, ts, ids=True)
    neg = sample_test_negatives(tu, ti, test, n_items, eval_negatives, seed)
    from hvd_bert.data.output import staged

    with staged(out, overwrite) as tmp:  # (committed into out at the end; a failure leaves out as it was)
        atomic_write(tmp / "ncf.npz", lambda t: np.savez(open(t, "wb"), train_users=tu, train_items=ti,
                                                         test_items=test, test_negatives=neg,
                                                         user_ids=user_ids, item_ids=item_ids))
        meta = {"kind": KIND, "format": 1, "source": source, "seed": seed, "n_users": n_users,
                "n_items": n_items, "train_interactions": int(len(tu)), "test_negatives": eval_negatives,
                "shards": [{"file": "ncf.npz", "records": int(len(tu))}]}
        write_sidecar(tmp, meta)
    return meta


def load_ncf(folder: str | Path) -> NCFData:
    import zipfile

    meta = read_sidecar(folder, KIND)
    path = Path(folder) / "ncf.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            data = NCFData(z["train_users"], z["train_items"], z["test_items"], z["test_negatives"],
                           meta["n_users"], meta["n_items"],
                           *(z[k] if k in z.files else None for k in ("user_ids", "item_ids")))
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, EOFError) as e:
        raise DatasetError(f"{path} is not a complete NCF data file ({type(e).__name__}: {e}); prepare it "
                           f"again (hvd-bert prepare-ncf)") from None
    again = "prepare it again (hvd-bert prepare-ncf)"
    for ids, count in ((data.user_ids, meta.get("n_users")), (data.item_ids, meta.get("n_items"))):
        if ids is not None and (ids.ndim != 1 or len(ids) != count):
            raise DatasetError(f"{path}: its id tables do not match {folder}/dataset.json; {again}")
        if ids is not None and len(np.unique(ids)) != len(ids):  # (an id of two users or items)
            raise DatasetError(f"{path}: its id table names one input id for two indices (a map that is "
                               f"not one-to-one); {again}")
    if not all(isinstance(meta.get(k), int) and meta[k] > 0 for k in ("n_users", "n_items")):
        raise DatasetError(f"{folder}/dataset.json's n_users and n_items are not positive counts; {again}")
    if len(data.test_items) != data.n_users or data.test_negatives.ndim != 2 \
            or data.test_negatives.shape[0] != data.n_users or len(data.train_users) != len(data.train_items):
        raise DatasetError(f"{path} does not match {folder}/dataset.json ({data.n_users} users); {again}")
    held = (data.test_negatives == np.asarray(data.test_items)[:, None]).any(axis=1)
    if held.any():  # (a negative is never a positive: HR@K would count the held-out item twice)
        raise DatasetError(f"{path}: user {int(np.argmax(held))}'s test negatives hold its held-out item; "
                           f"{again}")
    for name, ids, count in (("train_users", data.train_users, data.n_users),
                             ("train_items", data.train_items, data.n_items),
                             ("test_items", data.test_items, data.n_items),
                             ("test_negatives", data.test_negatives, data.n_items)):
        if not np.issubdtype(ids.dtype, np.integer):
            raise DatasetError(f"{path}: {name} is {ids.dtype}, not integer ids; {again}")
        if ids.size and (ids.min() < 0 or ids.max() >= count):
            worst = int(ids.max() if ids.max() >= count else ids.min())
            raise DatasetError(f"{path}: {name} holds id {worst}, outside the {count} of "
                               f"{folder}/dataset.json; {again}")
    bad = _negatives_fault(data)
    if bad:
        raise DatasetError(f"{path}: {bad}; {again}")
    return data


def _negatives_fault(data: NCFData, chunk: int = 4096) -> str | None:
    """What breaks the evaluation protocol in the test negatives (distinct items, none of them a
    positive of the user's: each would score HR@K against the wrong ranking), a chunk of users at
    a time; None when they keep it."""
    lookup = _positive_lookup(data.train_users, data.train_items, data.n_items)
    for lo in range(0, data.n_users, chunk):
        neg = np.asarray(data.test_negatives[lo:lo + chunk])
        ranked = np.sort(neg, axis=1)
        twice = (ranked[:, 1:] == ranked[:, :-1]).any(axis=1)
        if twice.any():
            return f"user {lo + int(np.argmax(twice))}'s test negatives name an item twice"
        users = np.repeat(np.arange(lo, lo + len(neg)), neg.shape[1]).reshape(neg.shape)
        rated = _is_positive(lookup, users, neg, data.n_items).any(axis=1)
        if rated.any():
            return (f"user {lo + int(np.argmax(rated))}'s test negatives hold an item it rated (a training "
                    f"positive)")
    return None


# ----------------------------------------------------------------------------- training data
class EpochData:
    """Each epoch's training pairs (every positive, ``num_negatives`` fresh negatives each) in an
    order shuffled with a seed of the epoch (:func:`epoch_pairs`): rank ``r`` takes positions
    ``r, r + P, ...`` and computes only those, so the epoch does not depend on the number of
    ranks. Every rank gets ``steps_per_epoch x k`` micro-batches of ``local_batch_size``."""

    CHUNK = 1 << 20  # pairs computed at a time (memory stays bounded at any data size)

    def __init__(self, data: NCFData, rank: int, world_size: int, local_batch_size: int,
                 backward_passes_per_step: int, num_negatives: int = 4, seed: int = 0):
        self.data, self.rank, self.world_size = data, rank, world_size
        self.b, self.k = local_batch_size, backward_passes_per_step
        self.num_negatives, self.seed = num_negatives, seed
        self.lookup = _positive_lookup(data.train_users, data.train_items, data.n_items)
        n = len(data.train_users) * (1 + num_negatives)
        global_batch = local_batch_size * backward_passes_per_step * world_size
        self.steps_per_epoch = n // global_batch
        if self.steps_per_epoch < 1:
            raise ConfigError(f"the global batch {global_batch} is larger than an epoch ({n} training "
                              f"pairs); lower train.batch.local_batch_size")
        self.micro_per_epoch = self.steps_per_epoch * backward_passes_per_step

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """This rank's ``(users, items, labels)`` micro-batches of ``epoch`` from ``start`` on."""
        keys, b, d = epoch_keys(self.seed, epoch), self.b, self.data
        per_chunk = max(1, self.CHUNK // b)
        for m0 in range(start, self.micro_per_epoch, per_chunk):
            m1 = min(m0 + per_chunk, self.micro_per_epoch)
            positions = self.rank + self.world_size * np.arange(m0 * b, m1 * b, dtype=np.int64)
            u, i, y = epoch_pairs(d.train_users, d.train_items, d.n_items, self.num_negatives, positions,
                                  keys, self.lookup)
            for m in range(m1 - m0):
                s = slice(m * b, (m + 1) * b)
                yield u[s], i[s], y[s]

    def stream(self, start_micro: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        epoch, start = divmod(start_micro, self.micro_per_epoch)
        while True:
            yield from self.epoch(epoch, start)
            epoch, start = epoch + 1, 0
