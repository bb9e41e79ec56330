"""The jobs, each written once for both frameworks: ``run(cfg, backend)``.

    pretrain    BERT pretraining (phase 1 / phase 2)
    finetune    BERT fine-tuning: classification, regression (STS-B), SQuAD
    ncf         NCF (NeuMF) recommendation, HR@K / NDCG@K
    predict     a fine-tuned model's predictions on your own text (predict_squad: SQuAD's answers;
                predict_tokens: a tag a word; predict_model: what a checkpoint predicts, its
                tokenizer and scorer)
    run_folder  what every job does with its run folder: the lock, config.json, the log, the last line

A job reads top to bottom: the backend's process set-up, the data checked against the config,
the model, the engine (``backend.engine``: optimizer, schedule, accumulation, precision,
broadcast), then ``train.loop.fit``. ``backend`` is ``train.backend.get_backend(cfg.framework)``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
import os

from hvd_bert.stop import EXIT_STOPPED  # a job stopped by a signal after saving: rerun it to resume

__all__ = ["JOBS", "EXIT_STOPPED", "run_job", "user_errors"]

# name -> (help, module of run(cfg, backend), fill-in of defaults, hint for a data error)
JOBS = {
    "pretrain": ("BERT pretraining, one process per rank: start it with horovodrun -np N or mpirun -np N",
                 "hvd_bert.jobs.pretrain", "pretrain_defaults", "pretrain_data_hint"),
    "finetune": ("BERT fine-tuning from a pretrained checkpoint: classification, regression (STS-B) or "
                 "SQuAD, one process per rank (horovodrun / mpirun)", "hvd_bert.jobs.finetune", None, None),
    "ncf": ("NCF (NeuMF) recommendation with HR@10 / NDCG@10, one process per rank (horovodrun / "
            "mpirun)", "hvd_bert.jobs.ncf", "ncf_defaults", None),
    "predict": ("a fine-tuned model's predictions on a TSV/CSV, JSON-lines or prepared set: label names "
                "and scores, one per example, or SQuAD's answers (one process, or several: -np N)",
                "hvd_bert.jobs.predict", None, None),
}



def user_errors() -> tuple[type, ...]:
    """The errors that are the user's to fix (bad settings, data, checkpoints, a diverged run):
    one line and exit status 2, never a traceback."""
    from hvd_bert.cluster.horovod import LaunchError
    from hvd_bert.config import ConfigError
    from hvd_bert.core.sharding import ShardingError
    from hvd_bert.data.records import DatasetError
    from hvd_bert.train.checkpoint import RunFolderBusy
    from hvd_bert.train.engine import CheckpointError, ResumeError
    from hvd_bert.train.log import DivergedError
    from hvd_bert.weights.portable import WeightsError

    return (ConfigError, DatasetError, WeightsError, CheckpointError, ResumeError, DivergedError,
            RunFolderBusy, ShardingError, LaunchError)


def refuse_horovod_files_over_inputs(cfg) -> None:
    """The files Horovod writes (``train.horovod.timeline``, ``autotune_log``) and a local MLflow
    store (``MLFLOW_TRACKING_URI``) never over what the job reads (``run_folder.job_reads``), the
    store never in a checkpoint: refused (``files.OutputClash``, one line) before Horovod starts,
    on every rank alike."""
    from hvd_bert.files import refuse_clash
    from hvd_bert.jobs.run_folder import job_reads

    hcfg, reads = cfg.train.horovod, job_reads(cfg)
    for key in ("input", "checkpoint", "recommend"):  # (predict's and NCF's other inputs)
        if str(getattr(cfg, key, "") or ""):
            reads[key] = getattr(cfg, key)
    import os

    for key, path in (("timeline", hcfg.timeline), ("autotune_log", hcfg.autotune_log)):
        if path:
            refuse_clash(path, reads, what=f"train.horovod.{key}")
    for var in ("HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE_LOG"):  # (the same files, set in the environment)
        if os.environ.get(var):
            refuse_clash(os.environ[var], reads, what=var)
    if "mlflow" in cfg.train.report_to:  # a local MLflow store: never in an input, nor in a checkpoint

        from hvd_bert.files import OutputClash
        from hvd_bert.train.checkpoint import ALL, is_checkpoint_name
        from hvd_bert.train.trackers import local_store

        store = local_store(os.environ.get("MLFLOW_TRACKING_URI"))
        if store is not None:
            refuse_clash(store, reads, what="MLFLOW_TRACKING_URI's store", folder=True)
            resolved = store.resolve()
            hit = next((p for p in (resolved, *resolved.parents)
                        if any(is_checkpoint_name(p, s) for s in ALL)), None)
            if hit is not None:
                import errno

                raise OutputClash(errno.EEXIST, f"MLFLOW_TRACKING_URI's store {store} lies inside the "
                                                f"checkpoint {hit}, which checkpoints replace and prune: put "
                                                f"the store outside every checkpoint, e.g. in the run folder")


def remove_unused_run_folder(folder: Path) -> None:
    """A run folder this job made and that holds nothing trained (no metrics, checkpoint or best
    model): removed by rank 0 (the job failed a check; its settings and empty logs are no run)."""
    import shutil

    from hvd_bert.train.checkpoint import ALL, list_checkpoints

    from hvd_bert.train.watchdog import launcher_rank

    rank = launcher_rank()
    metrics = folder / "metrics.jsonl"
    trained = (metrics.is_file() and metrics.stat().st_size > 0) or list_checkpoints(folder, ALL) \
        or any(folder.glob("best*"))
    if rank != 0 or not folder.is_dir() or trained:  # (a step's metrics are the user's to read)
        return
    shutil.rmtree(folder, ignore_errors=True)


def run_job(name: str, cfg, on_data_error=None) -> int:
    """Job ``name`` on ``cfg`` (the built-in data filled in where the job has one) with the
    backend of ``cfg.framework``; the exit status: 0, or ``EXIT_STOPPED`` when a signal stopped
    it before the end (a checkpoint was saved: not a success, so that a SLURM ``afterok``
    dependency waits for the run to finish; the job scripts requeue on it). ``on_data_error``
    receives the hint to add to a data error's line."""
    from hvd_bert.data import defaults
    from hvd_bert.data.records import DatasetError
    from hvd_bert.train.backend import get_backend

    _, module, fill, hint = JOBS[name]
    if fill is not None:
        cfg = getattr(defaults, fill)(cfg)
    if hint is not None and on_data_error is not None:
        on_data_error(lambda e: getattr(defaults, hint)(cfg) if isinstance(e, DatasetError) else "")
    from hvd_bert.stop import STOP
    from hvd_bert.train.watchdog import end_start, watch_start

    refuse_horovod_files_over_inputs(cfg)
    watch_start(STOP.command, getattr(getattr(cfg, "train", None), "stall_timeout_s", 0.0))
    out = str(getattr(getattr(cfg, "train", None), "output_dir", "") or "")
    fresh = bool(out) and not os.path.lexists(Path(out).expanduser())
    try:  # (the start-up is watched: train.watchdog; the loop or an evaluation ends it)
        result = importlib.import_module(module).run(cfg, get_backend(cfg.framework))
    except user_errors():
        if fresh:  # a check that failed after the run folder was made leaves no folder behind
            remove_unused_run_folder(Path(out).expanduser())
        raise
    finally:
        end_start()
    return EXIT_STOPPED if result.get("stopped") else 0
