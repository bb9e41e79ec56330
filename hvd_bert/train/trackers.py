"""Experiment trackers, as Hugging Face Trainer's and accelerate's ``report_to``: where rank 0
reports a run besides ``metrics.jsonl``, framework-free.

    train.report_to: [tensorboard]            # the default: tensorboard/ in the run folder
    train.report_to: [tensorboard, mlflow]    # also an MLflow run
    train.report_to: [tensorboard, wandb]     # also a Weights & Biases run (offline by default)

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
artifacts. A resumed run continues the same MLflow run.

A Weights & Biases run (``wandb``) is written offline into ``<run folder>/wandb/`` unless
``WANDB_MODE`` says otherwise (``wandb sync`` uploads it later; ``WANDB_MODE=online`` with a
login sends it as it goes): the project is ``WANDB_PROJECT`` or ``hvd_bert``, the run named after
the run folder, the resolved settings its config, every logged step's numbers its history under
metrics.jsonl's names, and a resumed run continues the same W&B run (``wandb_run.txt``).

A tracker is best-effort: it never costs the run. One that cannot start (a server that does not
answer, a malformed ``MLFLOW_TRACKING_URI``, a SQLite file that cannot be created) refuses the
run before it trains, in one line naming the store and the fix (exit status 2). One that fails
later (the store gone, the disk full, the server down) is named once in one line on stderr and
turned off; the training goes on to its normal end, and ``metrics.jsonl`` has every step.
HTTP requests to a tracking server are bounded (``HTTP_BOUNDS``, unless the user set them): a
server that does not answer is named within seconds, not after MLflow's own minutes of retries."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

__all__ = ["TRACKERS", "HTTP_BOUNDS", "make_writer", "Writers", "MlflowWriter", "WandbWriter", "record_key"]

TRACKERS = ("tensorboard", "mlflow", "wandb")
# MLflow's HTTP settings for this process where the user set none (MLflow's own: 120 s a request
# and 7 retries with backoff, minutes before a server that does not answer is named): 5 s a
# request, one retry (at once, then after a second: a server that restarts is tolerated).
# W&B's waits (its defaults: 90 s to start, a login with no bound), as MLflow's: a server that does
# not answer costs a run seconds, not minutes, before the one line
WANDB_BOUNDS = {"init_timeout": 10.0, "login_timeout": 5.0, "x_graphql_timeout_seconds": 5.0,
                "finish_timeout": 30.0}
HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
               "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5"}


def _artifacts_beside(uri: str) -> str | None:
    """A local SQLite store's artifact folder, beside its database file; None for a server or
    a file store (MLflow's own choice)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    return (Path(uri[len(prefix):]).expanduser().resolve().parent / "mlflow-artifacts").as_uri()


class Writers:
    """Several writers as one (``add_scalar``, ``purge_from``, ``close``), each best-effort: a
    writer that raises is named once on stderr (one line) and left out from then on."""

    def __init__(self, writers: dict):
        self.writers = {name: w for name, w in writers.items() if w is not None}

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        for name, w in list(self.writers.items()):
            self._guard(name, f"logging {tag} at step {step}", w.add_scalar, tag, value, step)

    def purge_from(self, step: int) -> None:
        for name, w in list(self.writers.items()):
            if hasattr(w, "purge_from"):
                self._guard(name, f"dropping the points after step {step - 1}", w.purge_from, step)

    def close(self) -> None:
        for name, w in list(self.writers.items()):
            self._guard(name, "ending the run", w.close)
        self.writers = {}

    def _guard(self, name: str, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - no tracker's error may end the training
            from hvd_bert.stop import STOP

            where = getattr(self.writers.pop(name), "where", "")
            line = (f"{STOP.command}: {name}: {what} failed{where} ({_reason(e)}); tracking is off for the "
                    f"rest of this run, which goes on (metrics.jsonl has every step)")
            try:
                os.write(2, (line + "\n").encode())
            except OSError:
                pass


# what an error's text comes to (the first pattern found), for the lines that name a failure
_REASONS = ((r"Connection refused", "connection refused"),
            (r"[Rr]ead timed out|timed out|ConnectTimeout", "no answer within {timeout} s"),
            (r"Name or service not known|Failed to resolve|nodename nor servname",
             "the host name does not resolve"),
            (r"Connection reset|RemoteDisconnected|Connection aborted", "the connection was dropped"),
            (r"unable to open database file", "unable to open the database file"),
            (r"readonly database", "the database is read-only"),
            (r"disk I/O error", "a disk I/O error"),
            (r"database or disk is full|No space left", "the disk is full"),
            (r"filesystem tracking backend",
             "MLflow takes it for a folder, its file store, off unless MLFLOW_ALLOW_FILE_STORE=true"),
            (r"unsupported URI|registered tracking store", "no MLflow store takes this scheme"))
_SILENT = ("connection refused", "no answer within", "the host name does not resolve",
           "the connection was dropped")  # (a server that does not answer)


def _reason(e: BaseException) -> str:
    """An exception as a few words: what a network or SQLite error comes to, else its first
    line (MLflow's and SQLAlchemy's messages run over several lines and name their own docs)."""
    text = f"{e}".strip() or type(e).__name__
    for pattern, words in _REASONS:
        if re.search(pattern, text):
            return words.format(timeout=os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "?"))
    if isinstance(e, (FileExistsError, NotADirectoryError)) and e.filename:  # (a file where a folder goes)
        return f"{e.filename} is not a folder"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    first = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", text.splitlines()[0])
    return first if len(first) <= 200 else first[:197] + "..."


def record_key(tag: str) -> str:
    """A TensorBoard tag (``train/loss``, ``eval/loss``: ``train.log``'s) as the key metrics.jsonl
    and ``best_metric`` use (``loss``, ``eval_loss``), which MLflow shows, as Trainer's do."""
    prefix, _, name = tag.partition("/")
    return name if prefix == "train" or not name else f"{prefix}_{name}"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@contextlib.contextmanager
def _quiet():
    """MLflow's own log lines off while it works for the run (its INFO lines as it creates a
    database, a warning at each retry, an error with its traceback when a write fails): what
    fails is the one line :class:`Writers` or the refusal prints. MLFLOW_LOGGING_LEVEL, when
    the user sets it, keeps them."""
    if os.environ.get("MLFLOW_LOGGING_LEVEL"):
        yield
        return
    log = logging.getLogger("mlflow")
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(level)


class MlflowWriter:
    """One MLflow run: parameters at the start, metrics per step, the best model at the end.
    One that cannot start raises ConfigError (one line: the store and the fix)."""

    def __init__(self, out: Path, job: str, params: dict):
        try:
            import mlflow
        except ImportError:
            from hvd_bert.config import ConfigError
            raise ConfigError("train.report_to names mlflow, which is not installed here: pip install "
                              "mlflow-skinny sqlalchemy alembic (or mlflow), or leave mlflow out of "
                              "train.report_to") from None
        for name, value in HTTP_BOUNDS.items():  # (read by MLflow at each request)
            os.environ.setdefault(name, value)
        self.mlflow, self.out = mlflow, Path(out)
        given = os.environ.get("MLFLOW_TRACKING_URI")
        if given is not None and _in_memory(given):
            from hvd_bert.config import ConfigError
            raise ConfigError(f"MLFLOW_TRACKING_URI={given} keeps the runs in this process's memory: every "
                              f"metric would be lost when the job ends; give sqlite:///PATH (a file), a "
                              f"server, or unset it for sqlite:///<run folder>/mlflow.db, or leave mlflow "
                              f"out of train.report_to")
        self.uri = given or f"sqlite:///{self.out.resolve() / 'mlflow.db'}"
        self.where = f" at {self.uri}"  # (named in a line about a failure)
        try:
            with _quiet():
                self.run_id = self._start(job, params)
        except Exception as e:  # noqa: BLE001 - whatever MLflow raises, one line
            from hvd_bert.config import ConfigError
            raise ConfigError(_start_problem(self.uri, e, given is not None, _experiment(job))) from None

    def _start(self, job: str, params: dict) -> str:
        mlflow = self.mlflow
        _check_sqlite(self.uri)
        self.client = mlflow.tracking.MlflowClient(self.uri)
        name = _experiment(job)
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            exp_id = self.client.create_experiment(name, artifact_location=_artifacts_beside(self.uri))
        else:
            exp_id = exp.experiment_id
        run_id = self._previous(exp_id)  # a resumed run continues its MLflow run
        if run_id is None:
            run = self.client.create_run(exp_id, run_name=self.out.resolve().name,
                                         tags={"hvd_bert.run_folder": str(self.out.resolve())})
            run_id = run.info.run_id
            items = [(k, str(v)[:6000]) for k, v in _flat(params).items()]
            for i in range(0, len(items), 100):  # (MLflow takes at most 100 parameters a call)
                batch = [mlflow.entities.Param(k, v) for k, v in items[i:i + 100]]
                self.client.log_batch(run_id, params=batch)
            self._record(run_id)  # (once the run holds its parameters: a refused start leaves no mark)
        return run_id

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
            with _quiet():
                self.client.log_metric(self.run_id, record_key(tag), float(value), step=int(step))

    def close(self) -> None:
        with _quiet():
            self._end()

    def _end(self) -> None:
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


class WandbWriter:
    """One Weights & Biases run: the settings as its config, metrics per step (their
    metrics.jsonl names), offline unless ``WANDB_MODE`` is set. One that cannot start raises
    ConfigError (one line: the folder or mode and the fix)."""

    def __init__(self, out: Path, job: str, params: dict):
        os.environ.setdefault("WANDB_SILENT", "true")  # (its login line too: the job's lines are its own)
        try:
            import wandb
        except ImportError:
            from hvd_bert.config import ConfigError
            raise ConfigError("train.report_to names wandb, which is not installed here: pip install wandb, "
                              "or leave wandb out of train.report_to") from None
        self.out = Path(out)
        mode = os.environ.get("WANDB_MODE", "offline")  # (nothing leaves the machine unless asked)
        self.where = f" ({mode}, in {self.out / 'wandb'})"
        mark = self.out / "wandb_run.txt"
        previous = mark.read_text().strip() if mark.is_file() else None
        try:
            self.run = wandb.init(
                mode=mode, dir=str(self.out), project=os.environ.get("WANDB_PROJECT", "hvd_bert"),
                name=self.out.resolve().name, group=job, config=_flat(params), id=previous,
                resume="allow" if previous else None, reinit="finish_previous",
                settings=wandb.Settings(silent=True, quiet=True, console="off", x_disable_stats=True,
                                        disable_git=True, save_code=False, **WANDB_BOUNDS))
        except Exception as e:  # noqa: BLE001 - whatever wandb raises, one line
            from hvd_bert.config import ConfigError
            raise ConfigError(f"train.report_to=wandb: cannot start a Weights & Biases run{self.where} "
                              f"({_reason(e)}): check WANDB_MODE (offline, online with a login, disabled) "
                              f"and that the run folder is writable, or leave wandb out of "
                              f"train.report_to") from None
        if previous != self.run.id:
            from hvd_bert.files import atomic_write

            atomic_write(mark, lambda t: t.write_text(self.run.id + "\n"))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        import math

        if math.isfinite(value):
            self.run.log({record_key(tag): float(value)}, step=int(step))

    def close(self) -> None:
        self.run.finish()


def local_store(uri: str | None) -> Path | None:
    """The file or folder a local MLflow store writes (an SQLite database, and its artifact folder
    beside it; a file store's folder), or None for a server, memory or no URI."""
    from urllib.parse import unquote, urlparse

    if not uri or _in_memory(uri):
        return None
    if uri.startswith("sqlite:///"):
        return Path(unquote(uri[len("sqlite:///"):].split("?")[0])).expanduser()
    try:
        parsed = urlparse(uri)
    except ValueError:  # (a malformed URI: the tracker's start refuses it, naming why)
        return None
    if parsed.scheme == "file":
        return Path(unquote(parsed.path)).expanduser()
    return Path(uri).expanduser() if parsed.scheme in ("", ) else None


def _in_memory(uri: str) -> bool:
    """An SQLite URI without a file (``sqlite://``, ``sqlite:///:memory:``): a store in memory."""
    from urllib.parse import unquote

    if not uri.startswith("sqlite:"):
        return False
    path = unquote(uri[len("sqlite:"):].split("?")[0]).lstrip("/")
    return path in ("", ":memory:")


def _check_sqlite(uri: str) -> None:
    """A local SQLite store can be created and written, or this raises (OSError or sqlite3's
    error) at once: MLflow itself tries to open one for about 100 s, with a warning each time,
    before it gives up. The database is created empty where it is missing, as MLflow would."""
    import sqlite3
    from urllib.parse import unquote

    prefix = "sqlite:///"
    path = unquote(uri[len(prefix):].split("?")[0]) if uri.startswith(prefix) else ""
    if not path or path == ":memory:":
        return
    db = Path(path).expanduser()
    db.parent.mkdir(parents=True, exist_ok=True)  # (as MLflow does)
    if os.statvfs(db.parent).f_flag & os.ST_RDONLY:  # (named as such: SQLite only says "unable to open")
        import errno

        raise OSError(errno.EROFS, "read-only file system", str(db.parent))
    con = sqlite3.connect(str(db), timeout=5)
    try:
        con.execute("BEGIN IMMEDIATE")  # (takes the write lock: a read-only file or folder fails here)
        con.rollback()
    finally:
        con.close()


def _experiment(job: str) -> str:
    """The MLflow experiment a job's runs go to: MLFLOW_EXPERIMENT_NAME, else ``hvd_bert <job>``."""
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"hvd_bert {job}"


def _start_problem(uri: str, e: Exception, given: bool, experiment: str) -> str:
    """The line for an MLflow run that cannot start at ``uri`` (``given``: by MLFLOW_TRACKING_URI)
    in ``experiment``."""
    from urllib.parse import urlparse

    reason, off = _reason(e), "or leave mlflow out of train.report_to"
    try:
        scheme = urlparse(uri).scheme.lower()
    except ValueError:
        scheme = "?"
    if scheme in ("http", "https"):
        if reason.startswith(_SILENT):
            timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT")
            return (f"train.report_to=mlflow: the MLflow tracking server at {uri} does not answer "
                    f"({reason}): start it, or set MLFLOW_TRACKING_URI to one that answers "
                    f"(MLFLOW_HTTP_REQUEST_TIMEOUT, now {timeout} s, is how long to wait), {off}")
        return (f"train.report_to=mlflow: the MLflow tracking server at {uri} refused to start the run "
                f"({reason}): check MLFLOW_TRACKING_URI and the server's credentials (MLFLOW_TRACKING_TOKEN, "
                f"or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD), {off}")
    if "must be in the 'active' state" in str(e):  # (the experiment was deleted in this store)
        return (f"train.report_to=mlflow: the experiment {experiment} is deleted in the MLflow store {uri}: "
                f"restore it (mlflow experiments restore), or set MLFLOW_EXPERIMENT_NAME to another name, "
                f"{off}")
    if scheme == "sqlite":
        path = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else uri
        fix = ("set MLFLOW_TRACKING_URI to sqlite:////<absolute path>/mlflow.db in a writable folder, or "
               "unset it for the run folder's own" if given else "make the run folder writable")
        return (f"train.report_to=mlflow: cannot create or open the MLflow SQLite store {path} ({reason}) "
                f"(from {'MLFLOW_TRACKING_URI' if given else 'the run folder'}): {fix}, {off}")
    return (f"train.report_to=mlflow: MLFLOW_TRACKING_URI={uri!r} is not a tracking store MLflow can open "
            f"({reason}): use http(s)://<host>:<port> (a server), sqlite:////<absolute path>/mlflow.db, or a "
            f"folder with MLFLOW_ALLOW_FILE_STORE=true; unset it for the run folder's own, {off}")


def make_writer(report_to, out: Path, job: str, params: dict, tensorboard=None):
    """Rank 0's writer for ``train.report_to``: ``tensorboard`` (the backend's, given) and/or an
    MLflow run, each best-effort (:class:`Writers`); None when it names neither. An MLflow run
    that cannot start raises ConfigError."""
    unknown = [t for t in report_to if t not in TRACKERS]
    if unknown:
        from hvd_bert.config import ConfigError
        raise ConfigError(f"train.report_to: unknown tracker {unknown[0]!r}; choose from "
                          f"{', '.join(TRACKERS)}")
    if tensorboard is not None and "tensorboard" in report_to:
        _check_tensorboard_folder(out / "tensorboard")
    writers = {"tensorboard": tensorboard if "tensorboard" in report_to else None,
               "mlflow": MlflowWriter(out, job, params) if "mlflow" in report_to else None,
               "wandb": WandbWriter(out, job, params) if "wandb" in report_to else None}
    writers = {name: w for name, w in writers.items() if w is not None}
    return Writers(writers) if writers else None


def _check_tensorboard_folder(where: Path) -> None:
    """TensorBoard can start: its log folder is a folder this process may write into, or can be
    made (its event file opens at the first scalar, so a refused run writes none); a ConfigError
    in one line otherwise."""
    from hvd_bert.config import ConfigError

    if where.exists() or where.is_symlink():
        fault = None if where.is_dir() else "is not a folder"
        fault = fault or (None if os.access(where, os.W_OK | os.X_OK) else "is not writable")
    else:
        parent = where.parent
        fault = None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be made ({parent} is not writable)"
    if fault:
        raise ConfigError(f"train.report_to=tensorboard: its log folder {where} {fault}: move what is there "
                          f"away, give another train.output_dir, or leave tensorboard out of train.report_to")
