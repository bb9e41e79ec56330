"""What every job writes into its run folder and prints around the loop, in one place."""

from __future__ import annotations

import json
import re
import socket
from dataclasses import replace
from pathlib import Path

from hvd_bert.cluster.horovod import horovod_settings_line, placement_line
from hvd_bert.weights.portable import write_run_bert_config
from hvd_bert.files import atomic_write
from hvd_bert.train.checkpoint import run_folder_of
from hvd_bert.config import ConfigError, to_dict
from hvd_bert.train.elastic import PlainLaunch
from hvd_bert.train.identity import has_checkpoints, rank_identity, ranks_disagree, run_record
from hvd_bert.train.log import RunLog
from hvd_bert.train.run_folder import claim_run_folder, raise_problem
from hvd_bert.train.trackers import make_writer

__all__ = ["with_run_folder", "open_run", "finish_line", "ranks_agree"]



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


def job_reads(cfg) -> dict:
    """What a job reads, which its ``train.output_dir`` must not be nor lie inside: its data,
    held-out data and initial checkpoint (and that checkpoint's run folder)."""
    reads = {}
    for key in ("data", "eval_data", "init_checkpoint"):
        value = str(getattr(cfg, key, "") or "")
        if value:
            reads[key] = Path(value).expanduser()
            if key == "init_checkpoint" and not reads[key].is_dir():
                reads["init_checkpoint's run folder"] = run_folder_of(reads[key])
    return reads


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
    # One job per run folder: rank 0 claims it (train.run_folder: the checks and the lock) before
    # anything is written; every rank learns the outcome.
    new = not out.exists()  # (a folder this job makes is removed again if its trackers refuse to start)
    claim = claim_run_folder(out, to_dict(cfg), reads=job_reads(cfg),
                             defaults=to_dict(type(cfg)())) if rank == 0 else None
    problem = claim.problem if claim is not None else None
    writer = None
    if rank == 0 and not problem:  # (train.report_to: TensorBoard, MLflow and/or W&B)
        try:
            tb = backend.summary_writer(out / "tensorboard") if "tensorboard" in cfg.train.report_to else None
            job = getattr(type(cfg), "JOB", "train")
            writer = make_writer(cfg.train.report_to, out, job, to_dict(cfg), tb)
        except Exception:
            if new:  # (nothing of the user's is in it: the refusal leaves no trace)
                import shutil

                claim.release()
                shutil.rmtree(out, ignore_errors=True)
            raise
    log = RunLog(out, -1 if problem else rank, total_steps=total_steps, progress=cfg.progress,  # -1: silent
                 writer=writer, line_keys=line_keys)

    def agree() -> None:
        raise_problem(backend.broadcast_object(problem, "hvd_bert.run.open"))
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


def finish_line(res, rank: int, detail: str, backend, out: Path | None = None,
                evaluated: bool = True) -> None:
    """Rank 0's last line (with ``out``: where the metrics and the TensorBoard logs are, the same
    for every job); then every rank waits for it (a collective), so that no rank exits (with
    status 3 after a signal, which launchers answer by killing the others) before it is out."""
    # (only what exists: a run stopped early may have logged nothing yet)
    if out is not None and (out / "metrics.jsonl").is_file():
        detail += f"; metrics: {out / 'metrics.jsonl'}"
    if out is not None and (out / "tensorboard").is_dir() and any((out / "tensorboard").iterdir()):
        detail += f"; TensorBoard: tensorboard --logdir {out / 'tensorboard'}"
    phases = res.phases  # (FitResult's: which phase set the peak)
    if phases is not None:
        if evaluated:  # (``evaluated``: a final evaluation ran, which may have set the peak)
            phases.mark("eval")
        if rank == 0 and phases.line():
            print(phases.line(), flush=True)
    if rank == 0:
        how = "stopped by a signal at" if res.stopped_by_signal else "finished"
        rerun = "; run the same command again to resume (exit status 3)" if res.stopped_by_signal else ""
        print(f"{how} step {res.steps}; {detail}{rerun}", flush=True)
    backend.broadcast_object(None, "hvd_bert.finished")
