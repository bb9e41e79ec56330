"""What every job writes into its run folder and prints around the loop, in one place."""

from __future__ import annotations

import atexit
import json
import re
import socket
from dataclasses import replace
from pathlib import Path

from hvd_bert.cluster.horovod import horovod_settings_line, placement_line
from hvd_bert.weights.portable import write_run_bert_config
from hvd_bert.files import OutputClash, atomic_write, planted_link, refuse_clash
from hvd_bert.train.checkpoint import RunFolderBusy, lock_run_folder, release_run_folder, run_folder_of
from hvd_bert.config import ConfigError, to_dict
from hvd_bert.train.elastic import PlainLaunch
from hvd_bert.train.identity import (has_checkpoints, rank_identity, ranks_disagree, resume_mismatch,
                                     run_record)
from hvd_bert.train.log import RunLog
from hvd_bert.train.trackers import make_writer

__all__ = ["with_run_folder", "open_run", "refuse_output_over_inputs", "finish_line", "ranks_agree"]

_LOCKS: list = []  # the run folders this process holds (released when it exits)
RUN_FILES = ("metrics.jsonl", "tensorboard")  # what a job appends to or writes into, by name


def ranks_agree(cfg, backend, launch=None) -> None:
    """Right after ``backend.init``: every rank has the same resolved settings and data
    (``train.identity.rank_identity``), or every rank raises the same ConfigError naming the
    differences, before any rank builds a model or waits in a collective of its own. Under
    Horovod elastic (``launch``), where no collective may come before the state sync, the ranks
    compare on the first entry instead."""
    (launch or PlainLaunch()).at_start(lambda: _compare(cfg, backend))


def _compare(cfg, backend) -> None:
    import hashlib

    mine = rank_identity(to_dict(cfg))
    digest = hashlib.sha256(json.dumps(mine, sort_keys=True, default=str).encode()).hexdigest()
    if len(set(backend.allgather_object(digest, "hvd_bert.settings.digest"))) == 1:
        return
    problem = ranks_disagree(backend.allgather_object(mine, "hvd_bert.settings"))
    raise ConfigError(problem or "the ranks were given different settings")


def with_run_folder(cfg, job: str):
    """``cfg`` with an empty ``train.output_dir`` filled in as ``runs/<job>-<framework>-<data
    folder name>``: by default, jobs, frameworks and data sets never share a run folder."""
    if cfg.train.output_dir:
        return cfg
    data = Path(str(cfg.data).rstrip("/")).name if cfg.data else "default"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{job}-{cfg.framework}-{data}")
    return replace(cfg, train=replace(cfg.train, output_dir=str(Path("runs") / name)))


def refuse_output_over_inputs(cfg) -> None:
    """``train.output_dir`` must not be, or lie inside, what the job reads: its data, held-out
    data or initial checkpoint (``files.refuse_clash``, by path and by inode)."""
    reads = {}
    for key in ("data", "eval_data", "init_checkpoint"):
        value = str(getattr(cfg, key, "") or "")
        if value:
            reads[key] = Path(value).expanduser()
            if key == "init_checkpoint" and not reads[key].is_dir():
                reads["init_checkpoint's run folder"] = run_folder_of(reads[key])
    refuse_clash(cfg.train.output_dir, reads, what="train.output_dir", run_folder=True)


def open_run(cfg, backend, rank: int, *, total_steps: int, line_keys: tuple[str, ...], bert=None,
             launch=None) -> RunLog:
    """On rank 0: the run folder, its ``config.json`` (the resolved config, with the real
    ``total_steps``) and ``bert_config.json`` (``bert``: a BERT job's model), and the run's
    :class:`RunLog` (bar or progress lines, ``metrics.jsonl``, TensorBoard); other ranks get a
    RunLog that does nothing. Its collectives (every rank raises rank 0's run-folder error, the
    Horovod settings line, the placement line) run when ``launch`` (``train.elastic.launch_mode()``)
    says: at once, or under Horovod elastic on the first entry and after every change of the world."""
    launch = launch or PlainLaunch()
    out = Path(cfg.train.output_dir)
    # One job per run folder: rank 0 locks it before writing anything; every rank learns the outcome.
    # A rerun that would resume another run's checkpoints is refused before anything is written.
    problem = None
    if rank == 0:
        try:
            refuse_output_over_inputs(cfg)  # (before anything is written; every rank learns the outcome)
            lock = lock_run_folder(out)
            _LOCKS.append(lock)
            atexit.register(release_run_folder, lock)  # a clean exit (0, 2 or 3) leaves no lock file
        except RunFolderBusy as e:
            problem = ("busy", str(e))
        except OutputClash as e:
            problem = ("config", e.strerror)
        else:
            # (the batch layout is the checkpoint's to check: the same global batch, the world size)
            mismatch = planted_link(out, RUN_FILES) or resume_mismatch(out, to_dict(cfg), ("train.batch",))
            problem = ("config", mismatch) if mismatch else None
    writer = None
    if rank == 0 and not problem:  # (train.report_to: TensorBoard and/or MLflow)
        tb = backend.summary_writer(out / "tensorboard") if "tensorboard" in cfg.train.report_to else None
        writer = make_writer(cfg.train.report_to, out, getattr(type(cfg), "JOB", "train"), to_dict(cfg), tb)
    log = RunLog(out, -1 if problem else rank, total_steps=total_steps, progress=cfg.progress,  # -1: silent
                 writer=writer, line_keys=line_keys)

    def agree() -> None:
        shared = backend.broadcast_object(problem, "hvd_bert.run.open")
        if shared:
            kind, message = shared
            raise RunFolderBusy(message) if kind == "busy" else ConfigError(message)
        if rank == 0:
            def record() -> None:
                record_ = run_record(to_dict(cfg))
                atomic_write(out / "config.json", lambda t: t.write_text(json.dumps(record_, indent=1)))
                if bert is not None:
                    write_run_bert_config(out, bert)
            if has_checkpoints(out):  # recorded once the checkpoint passed its own checks (fit resumes it)
                log.after_resume.append(record)
            else:
                record()

    def announce() -> None:
        log.print(placement_line(backend.allgather_object(socket.gethostname(), "hvd_bert.hosts")))

    launch.at_start(agree, lambda: log.print(horovod_settings_line()))  # the Horovod knobs in effect, once
    launch.on_world(announce)
    return log


def finish_line(res, rank: int, detail: str, backend, out: Path | None = None) -> None:
    """Rank 0's last line (with ``out``: where the metrics and the TensorBoard logs are, the same
    for every job); then every rank waits for it (a collective), so that no rank exits (with
    status 3 after a signal, which launchers answer by killing the others) before it is out."""
    if out is not None:
        detail += (f"; metrics: {out / 'metrics.jsonl'}; TensorBoard: tensorboard --logdir "
                   f"{out / 'tensorboard'}")
    if rank == 0:
        how = "stopped by a signal at" if res.stopped_by_signal else "finished"
        rerun = "; run the same command again to resume (exit status 3)" if res.stopped_by_signal else ""
        print(f"{how} step {res.steps}; {detail}{rerun}", flush=True)
    backend.broadcast_object(None, "hvd_bert.finished")
