"""What every job writes into its run folder and prints around the loop, in one place."""

from __future__ import annotations

import json
from pathlib import Path

from hvd_bert.cluster import horovod_settings_line
from hvd_bert.common.bert_weights import write_run_bert_config
from hvd_bert.common.checkpoint import RunFolderBusy, atomic_write, lock_run_folder
from hvd_bert.common.config import to_dict
from hvd_bert.common.runlog import RunLog

__all__ = ["open_run", "finish_line"]

_LOCKS: list = []  # the run folders this process holds (released when it exits)


def open_run(cfg, backend, rank: int, *, total_steps: int, line_keys: tuple[str, ...], bert=None) -> RunLog:
    """On rank 0: the run folder, its ``config.json`` (the resolved config, with the real
    ``total_steps``) and ``bert_config.json`` (``bert``: a BERT job's model), and the run's
    :class:`RunLog` (bar or progress lines, ``metrics.jsonl``, TensorBoard); other ranks get a
    RunLog that does nothing."""
    out = Path(cfg.train.output_dir)
    # One job per run folder: rank 0 locks it before writing anything; every rank learns the outcome.
    busy = None
    if rank == 0:
        try:
            _LOCKS.append(lock_run_folder(out))
        except RunFolderBusy as e:
            busy = str(e)
    busy = backend.broadcast_object(busy, "hvd_bert.run.lock")
    if busy:
        raise RunFolderBusy(busy)
    if rank == 0:
        atomic_write(out / "config.json", lambda t: t.write_text(json.dumps(to_dict(cfg), indent=1)))
        if bert is not None:
            write_run_bert_config(out, bert)
    log = RunLog(out, rank, total_steps=total_steps, progress=cfg.progress,
                 writer=backend.summary_writer(out / "tensorboard") if rank == 0 else None,
                 line_keys=line_keys)
    log.print(horovod_settings_line())  # the Horovod knobs in effect, once
    return log


def finish_line(res, rank: int, detail: str) -> None:
    if rank == 0:
        how = "stopped by a signal at" if res.stopped_by_signal else "finished"
        print(f"{how} step {res.steps}; {detail}", flush=True)
