"""Experiment trackers, as Hugging Face Trainer's and accelerate's ``report_to``: where rank 0
reports a run besides ``metrics.jsonl``, framework-free.

    train.report_to: [tensorboard]            # the default: tensorboard/ in the run folder
    train.report_to: [tensorboard, mlflow]    # also an MLflow run

An MLflow run (``mlflow``, or the lighter ``mlflow-skinny`` with SQLAlchemy for a SQLite store)
goes to ``MLFLOW_TRACKING_URI`` when it is set (a ``sqlite:///`` file, a local folder with
``MLFLOW_ALLOW_FILE_STORE=true``, or a server), else to ``sqlite:///<run folder>/mlflow.db``
with its artifacts in ``<run folder>/mlflow-artifacts``: nothing leaves the machine unless the
user points it elsewhere. A new experiment in a local SQLite store keeps its artifacts in
``mlflow-artifacts`` beside the database file (MLflow's own default is ``./mlruns`` under
whatever folder the job was started from); a server decides for itself. The experiment is
``MLFLOW_EXPERIMENT_NAME`` or the job's name, the run is named after the run folder; the
resolved settings are its parameters (dotted names, as ``--set`` takes them), every logged
step's numbers its metrics (``train/loss``, ``eval/...``), and when the run ends its best model
(``best.npz`` and ``best.json``, or NCF's ``best/``), else its newest checkpoint, its
artifacts. A resumed run continues the same MLflow run."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["TRACKERS", "make_writer", "Writers", "MlflowWriter"]

TRACKERS = ("tensorboard", "mlflow")


def _artifacts_beside(uri: str) -> str | None:
    """A local SQLite store's artifact folder, beside its database file; None for a server or
    a file store (MLflow's own choice)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    return (Path(uri[len(prefix):]).expanduser().resolve().parent / "mlflow-artifacts").as_uri()


class Writers:
    """Several writers as one (``add_scalar``, ``purge_from``, ``close``)."""

    def __init__(self, writers: list):
        self.writers = [w for w in writers if w is not None]

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        for w in self.writers:
            w.add_scalar(tag, value, step)

    def purge_from(self, step: int) -> None:
        for w in self.writers:
            if hasattr(w, "purge_from"):
                w.purge_from(step)

    def close(self) -> None:
        for w in self.writers:
            w.close()


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class MlflowWriter:
    """One MLflow run: parameters at the start, metrics per step, the best model at the end."""

    def __init__(self, out: Path, job: str, params: dict):
        try:
            import mlflow
        except ImportError:
            from hvd_bert.config import ConfigError
            raise ConfigError("train.report_to names mlflow, which is not installed here: pip install "
                              "mlflow-skinny sqlalchemy alembic (or mlflow), or leave mlflow out of "
                              "train.report_to") from None
        self.mlflow, self.out = mlflow, Path(out)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.out.resolve() / 'mlflow.db'}"
        self.client = mlflow.tracking.MlflowClient(uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"hvd_bert {job}"
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            exp_id = self.client.create_experiment(name, artifact_location=_artifacts_beside(uri))
        else:
            exp_id = exp.experiment_id
        run_id = self._previous(exp_id)  # a resumed run continues its MLflow run
        if run_id is None:
            run = self.client.create_run(exp_id, run_name=self.out.resolve().name,
                                         tags={"hvd_bert.run_folder": str(self.out.resolve())})
            run_id = run.info.run_id
            self._record(run_id)
            items = [(k, str(v)[:6000]) for k, v in _flat(params).items()]
            for i in range(0, len(items), 100):  # (MLflow takes at most 100 parameters a call)
                batch = [mlflow.entities.Param(k, v) for k, v in items[i:i + 100]]
                self.client.log_batch(run_id, params=batch)
        self.run_id = run_id

    def _previous(self, exp_id: str) -> str | None:
        mark = self.out / "mlflow_run.txt"
        try:
            run_id = mark.read_text().strip()
            run = self.client.get_run(run_id)
            return run_id if run.info.experiment_id == exp_id else None
        except Exception:  # noqa: BLE001 - no mark, or a run this store does not hold
            return None

    def _record(self, run_id: str) -> None:
        from hvd_bert.files import atomic_write

        atomic_write(self.out / "mlflow_run.txt", lambda t: t.write_text(run_id + "\n"))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        import math

        if math.isfinite(value):
            self.client.log_metric(self.run_id, tag, float(value), step=int(step))

    def close(self) -> None:
        best = [p for p in (self.out / "best.npz", self.out / "best.json", self.out / "best") if p.exists()]
        if not best:
            ckpts = sorted(self.out.glob("ckpt-*"))
            best = ckpts[-1:]
        for p in best:
            if p.is_dir():
                self.client.log_artifacts(self.run_id, str(p), artifact_path=p.name)
            else:
                self.client.log_artifact(self.run_id, str(p))
        self.client.set_terminated(self.run_id)


def make_writer(report_to, out: Path, job: str, params: dict, tensorboard=None):
    """Rank 0's writer for ``train.report_to``: ``tensorboard`` (the backend's, given) and/or an
    MLflow run; None when it names neither."""
    unknown = [t for t in report_to if t not in TRACKERS]
    if unknown:
        from hvd_bert.config import ConfigError
        raise ConfigError(f"train.report_to: unknown tracker {unknown[0]!r}; choose from "
                          f"{', '.join(TRACKERS)}")
    writers = [tensorboard if "tensorboard" in report_to else None,
               MlflowWriter(out, job, params) if "mlflow" in report_to else None]
    writers = [w for w in writers if w is not None]
    return Writers(writers) if writers else None
