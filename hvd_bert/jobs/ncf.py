"""NCF (NeuMF: GMF + MLP, He et al. 2017, NVIDIA's sizes) on Horovod, in either framework.

    horovodrun -np 2 -H localhost:2 --gloo hvd-bert ncf --framework pt \\
        --set data=runs/ml-1m --set target_hr=0.6

Each epoch's training pairs (positives and fresh sampled negatives, shuffled) are the same
for any number of ranks; each rank computes only its own every ``world_size``-th pair
(``data.ncf.EpochData``); binary cross-entropy
on the logits; any optimizer and schedule of the toolkit through the shared loop. After every
``eval_every`` epochs HR@K and NDCG@K are computed on all users, split across the ranks and
summed with an allreduce (``evaluation.ncf.evaluate``); the run stops early once HR@K reaches
``target_hr``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from hvd_bert.core.text import plural
from hvd_bert.config import ConfigError
from hvd_bert.files import atomic_write
from hvd_bert.train.loop import fit
from hvd_bert.train.watchdog import end_start
from hvd_bert.config import NCFConfig
from hvd_bert.data.ncf import EpochData
from hvd_bert.evaluation.ncf import EpochEvaluation, evaluate
from hvd_bert.data.ncf import load_ncf
from hvd_bert.jobs.run_folder import finish_line, open_run, ranks_agree, with_run_folder

__all__ = ["run"]

FEW_STEPS = 100  # steps an epoch below which a smaller batch is advised


def trained_checkpoint(path: str) -> Path:
    """The checkpoint ``init_checkpoint`` names: an NCF run folder's best model (``best/``), else
    its newest checkpoint, or a checkpoint itself."""
    from hvd_bert.train.checkpoint import ALL, checkpoint_folder, is_checkpoint_name, latest_checkpoint

    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"init_checkpoint {p} does not exist: give an NCF run folder or one of its "
                          f"ckpt-* checkpoints")
    found = p if any(is_checkpoint_name(p, s) for s in ALL) else \
        latest_checkpoint(p / "best", ALL) or latest_checkpoint(p, ALL)
    if found is None:
        raise ConfigError(f"init_checkpoint {p} holds no checkpoint (no best/ckpt-* and no ckpt-*): give "
                          f"the folder of a finished hvd-bert ncf run")
    folder = checkpoint_folder(found)
    if folder.name == "best":
        folder = folder.parent
    if (folder / "bert_config.json").is_file() or (folder / "task.json").is_file():
        raise ConfigError(f"init_checkpoint {p} holds a BERT checkpoint ({folder / 'bert_config.json'} "
                          f"beside it), not an NCF model: give the folder of a finished hvd-bert ncf run")
    return found


def trained_settings(cfg: NCFConfig) -> tuple[Path, NCFConfig, str | None]:
    """``do_train=false``: the checkpoint ``init_checkpoint`` names, ``cfg`` with the model and
    training settings its run folder's ``config.json`` records, and the data it was trained on
    when that is not ``cfg.data`` (else None) (the evaluation builds the model
    that was trained and reads the optimizer state it saved); a checkpoint of the other framework
    is refused, naming the framework to give."""
    from hvd_bert.config.base import overlay
    from hvd_bert.train.checkpoint import checkpoint_folder
    from hvd_bert.train.identity import DamagedConfig, previous_config

    if not cfg.init_checkpoint:
        raise ConfigError("do_train=false evaluates a trained model: give --set init_checkpoint=RUN (an NCF "
                          "run folder: its best model, else its newest checkpoint)")
    ckpt = trained_checkpoint(cfg.init_checkpoint)
    folder = checkpoint_folder(ckpt)
    folder = folder.parent if folder.name == "best" else folder
    try:
        old = previous_config(folder)
    except DamagedConfig as e:
        raise ConfigError(f"{folder / 'config.json'} is damaged ({e}): the trained model's settings cannot "
                          f"be read; restore it from the run") from None
    written = {"pt": "pt", "tf": "tf"}.get(ckpt.suffix[1:]) or (old or {}).get("framework")
    if written in ("pt", "tf") and written != cfg.framework:
        names = {"pt": "PyTorch", "tf": "TensorFlow"}
        raise ConfigError(f"init_checkpoint {ckpt} is a {names[written]} checkpoint: evaluate it with "
                          f"--framework {written}")
    if old is None:  # (a checkpoint without its run's config: the settings given must be its own)
        return ckpt, cfg, None
    from hvd_bert.data.sidecar import sidecar_digest

    trained_on = (old.get("data_identity") or {}).get("data")
    other = None  # (the data it was trained on, when not this: its tables are sized by that data)
    if trained_on and trained_on != sidecar_digest(cfg.data):
        other = str(old.get("data") or "another data folder")
    train = {k: v for k, v in (old.get("train") or {}).items()
             if k not in ("batch", "output_dir", "report_to", "checkpoint_format")}
    try:
        return ckpt, overlay(cfg, {"model": old.get("model") or {}, "train": train}), other
    except ConfigError as e:
        raise ConfigError(f"{folder / 'config.json'} does not hold an NCF run's settings ({e})") from None


def evaluate_only(cfg: NCFConfig, backend, data, engine, model, rank: int, size: int, ckpt: Path,
                  trained_data: str | None = None) -> dict:
    """``do_train=false``: every rank loads ``init_checkpoint``'s weights (``ckpt``), HR@K and
    NDCG@K over all users (a collective), and with ``recommend`` each listed user's ``top_k``
    unrated items."""
    users = out = None
    if cfg.recommend:  # (read and checked on every rank before anything is loaded or written)
        users, out = recommend_users(cfg.recommend, data, [cfg.data, ckpt])
    from hvd_bert.train.engine import CheckpointError, ResumeError

    try:
        resumed = engine.resume(ckpt)  # every rank its weights (a collective)
    except (CheckpointError, ResumeError):
        if not trained_data:
            raise
        raise ConfigError(f"init_checkpoint {ckpt} was trained on other data ({trained_data}): its user and "
                          f"item tables do not fit the {data.n_users} users and {data.n_items} items of "
                          f"{cfg.data}; evaluate it on the data it was trained on (--set "
                          f"data={trained_data}); the checkpoint is intact") from None
    if resumed is None:
        raise ConfigError(f"init_checkpoint {ckpt} holds no checkpoint this framework reads; give the folder "
                          f"of a finished hvd-bert ncf run")
    score = backend.ncf_scorer(model)
    res = evaluate(score, data, cfg.top_k, cfg.eval_batch_users, rank, size,
                   lambda sums: backend.allreduce_sum(sums, "hvd_bert.ncf.eval"))
    if rank == 0:
        print(f"evaluated {ckpt} on {cfg.data}: HR@{cfg.top_k} {res['hr']:.4f}, NDCG@{cfg.top_k} "
              f"{res['ndcg']:.4f} over {res['users']} users", flush=True)
    if users is not None:
        mine = {int(j): top_items(score, data, int(users[j]), cfg.top_k)
                for j in range(rank, len(users), size)}
        every = backend.allgather_object(mine, "hvd_bert.ncf.recommend")  # Horovod: (rank 0 writes)
        if rank == 0:
            rows = {j: r for part in every for j, r in part.items()}
            ids = data.user_ids if data.user_ids is not None else np.arange(data.n_users)
            items = data.item_ids if data.item_ids is not None else np.arange(data.n_items)
            lines = [json.dumps({"user": _plain(ids[users[j]]),
                                 "items": [_plain(items[i]) for i in rows[j][0]],
                                 "scores": [round(float(s), 6) for s in rows[j][1]]})
                     for j in range(len(users))]
            atomic_write(out, lambda t: t.write_text("\n".join(lines) + "\n"))
            print(f"wrote the top {cfg.top_k} unrated items of {len(users)} users to {out}", flush=True)
    backend.broadcast_object(None, "hvd_bert.finished")  # no rank exits before the file is written
    return {"steps": 0, "stopped": False, **res}


def recommend_users(path: str, data, reads: list) -> tuple[np.ndarray, Path]:
    """The users of a file of ids (the ratings file's own ids, one a line) as the data's user
    indices, and where their recommendations go; an unknown id is a DatasetError naming it."""
    from hvd_bert.data.records import DatasetError
    from hvd_bert.data.text_input import read_text
    from hvd_bert.files import refuse_clash

    source = Path(path).expanduser()
    out = source.with_name(source.name + ".recommendations.jsonl")
    what = f"recommend={source}'s output"
    refuse_clash(out, {"the user list": source, "the data": reads[0], "the checkpoint": reads[1]}, what=what)
    from hvd_bert.train.checkpoint import run_folder_of

    run = run_folder_of(reads[1])
    if run is not None:  # (a run folder is its run's: nothing else writes into it)
        refuse_clash(out, {"the checkpoint's run folder": run}, folder=True, what=what)
    import os

    if not os.access(out.parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise DatasetError(f"recommend={source}: its recommendations go to {out}, which cannot be written "
                           f"there; give a user list in a folder this job may write into")
    if not source.is_file():
        raise DatasetError(f"recommend={source} is not a file: give a file of user ids, one a line")
    wanted = [x.strip() for x in read_text(source, "recommend").splitlines() if x.strip()]
    known = data.user_ids if data.user_ids is not None else np.arange(data.n_users)
    index = {str(_plain(u)): j for j, u in enumerate(known)}
    missing = [u for u in wanted if u not in index]
    if not wanted or missing:
        what = f"the user {missing[0]!r} is not in" if missing else "no user id is in"
        old = ("" if data.user_ids is not None else
               "; data prepared before ids were kept: its users are 0 to n-1")
        raise DatasetError(f"{source}: {what} the data's {data.n_users} users (ids as in the ratings file"
                           f"{old}); give users of the data the model was trained on")
    return np.asarray([index[u] for u in wanted], np.int64), out


def top_items(score, data, user: int, k: int) -> tuple[list, list]:
    """``(items, scores)``: user ``user``'s ``k`` best-scored items among those it has not rated
    (its training positives and its held-out item left out)."""
    seen = np.zeros(data.n_items, bool)
    seen[data.train_items[data.train_users == user]] = True
    seen[data.test_items[user]] = True
    s = np.asarray(score(np.full(data.n_items, user, np.int64), np.arange(data.n_items, dtype=np.int64)),
                   np.float64)
    s[seen] = -np.inf
    best = np.argsort(-s, kind="stable")[:min(k, int((~seen).sum()))]
    return best.tolist(), s[best].tolist()


def _plain(x):
    """A numpy scalar as the plain number (or text) JSON writes."""
    return x.item() if hasattr(x, "item") else x


def run(cfg: NCFConfig, backend) -> dict:
    cfg = with_run_folder(cfg, "ncf")
    rank, size = backend.init(cfg.train)
    ranks_agree(cfg, backend)  # the same settings and data everywhere, or one line on every rank
    backend.set_precision(cfg.train.precision.mode)
    out = Path(cfg.train.output_dir)
    data = load_ncf(cfg.data)
    candidates = 1 + data.test_negatives.shape[1]
    if cfg.top_k >= candidates:
        raise ConfigError(f"top_k={cfg.top_k}, but each user's held-out item is ranked among {candidates} "
                          f"candidates (it and {candidates - 1} negatives), so HR@{cfg.top_k} would be 1.0: "
                          f"use top_k < {candidates} (MLPerf: 10)")
    if cfg.num_negatives >= data.n_items:
        raise ConfigError(f"num_negatives={cfg.num_negatives} negatives per positive, but the data has "
                          f"{data.n_items} items: an epoch would repeat every item for every positive; use "
                          f"fewer than {data.n_items} (MLPerf: 4)")
    if not cfg.do_train:  # a trained model's HR@K and its recommendations; no run folder is written
        # (nothing is trained: its model and training settings are its run's, and a one-example
        # micro-batch lets the resume keep any checkpoint's global batch, whatever its layout)
        from hvd_bert.config import BatchConfig

        ckpt, cfg, trained_data = trained_settings(cfg)
        backend.seed(cfg.train.seed)
        model = backend.neumf(data.n_users, data.n_items, cfg.model)
        engine = backend.engine(model, backend.ncf_loss, replace(cfg.train, batch=BatchConfig(
            local_batch_size=1, backward_passes_per_step=None)))
        end_start()  # (the start-up is over: an evaluation is not watched)
        return evaluate_only(cfg, backend, data, engine, model, rank, size, ckpt, trained_data)
    plan = cfg.train.batch.plan(size)
    epochs = EpochData(data, rank, size, plan.local_batch_size, plan.backward_passes_per_step,
                       cfg.num_negatives, cfg.train.seed)
    total = epochs.steps_per_epoch * cfg.epochs
    cfg = replace(cfg, train=replace(cfg.train, schedule=replace(cfg.train.schedule, total_steps=total)))
    backend.seed(cfg.train.seed)
    model = backend.neumf(data.n_users, data.n_items, cfg.model)
    engine = backend.engine(model, backend.ncf_loss, cfg.train)
    engine.keep_checkpoint_batch = False  # (its horizon is in epochs of this run's batch)

    log = open_run(cfg, backend, rank, total_steps=total, line_keys=("loss", "lr", "samples_per_s"))
    log.print(f"NeuMF ({backend.param_count(model) / 1e6:.2f}M parameters, {backend.label}) on {cfg.data}: "
              f"{data.n_users} users, {data.n_items} items, {len(data.train_users)} positives x "
              f"(1 + {cfg.num_negatives} negatives) = {epochs.steps_per_epoch} steps an epoch, at most "
              f"{plural(cfg.epochs, 'epoch')}")
    if epochs.steps_per_epoch < FEW_STEPS and plan.local_batch_size > 256:  # (the defaults are ml-20m's)
        smaller = max(256, plan.local_batch_size * epochs.steps_per_epoch // FEW_STEPS // 256 * 256)
        log.print(f"note: {epochs.steps_per_epoch} steps an epoch is few for the optimizer to converge in: "
                  f"the default batch ({plan.local_batch_size} a rank) suits ml-20m; for data this size give "
                  f"--set train.batch.local_batch_size={smaller} (and scale train.optim.lr down with it)")

    score = backend.ncf_scorer(model)

    def save_best(step: int, rec: dict) -> None:  # the best model by HR@K: best/ckpt-* and best.json
        engine.save(out / "best", {"micro_step": engine.micro_step}, keep=1)  # (a collective)
        if rank == 0:
            atomic_write(out / "best.json", lambda t: t.write_text(json.dumps(
                {"step": step, "metric": f"hr@{cfg.top_k}", "greater_is_better": True,
                 "score": rec[f"hr@{cfg.top_k}"], "scores": rec}, indent=1)))

    on_step = EpochEvaluation(cfg, epochs.steps_per_epoch, total, log, lambda: evaluate(
        score, data, cfg.top_k, cfg.eval_batch_users, rank, size,
        lambda sums: backend.allreduce_sum(sums, "hvd_bert.ncf.eval")), save_best=save_best)

    def batches_from(micro_step):
        for u, i, y in epochs.stream(micro_step):
            yield backend.ncf_batch(u, i, y)

    res = fit(engine, batches_from, total_steps=total, output_dir=out, log=log, unit="samples",
              on_step=on_step)
    log.close()
    best = on_step.best
    kept = f": {out / 'best'}" if best.get("step") else ""
    finish_line(res, rank, f"best HR@{cfg.top_k} {best['hr']:.4f} (epoch {best['epoch']:g}){kept}", backend,
                out)
    return {"steps": res.steps, "stopped": res.stopped_by_signal, **best}
