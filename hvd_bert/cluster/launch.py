"""Start a Python program on N Horovod processes (standard library only).

Used by ``hvd-bert doctor``, the benchmarks and ``tests/parallel``. Two launchers:
    ``gloo``  ``horovodrun -np N -H localhost:N --gloo python ...`` (through
              ``python -m hvd_bert.cluster.horovodrun``: Horovod's launcher without its TensorFlow import)
    ``mpi``   ``mpirun -np N python ...`` (OpenMPI; as root it adds --allow-run-as-root)
On several hosts (``hosts="node1:2,node2:2"``, reached over ssh) ``nic`` names the network
interface both launchers must use (``--network-interface`` / ``btl_tcp_if_include`` and
``oob_tcp_if_include``), and ``prefix`` is put before the launcher (for example
``scripts/fake_cluster.sh exec node1``: the launch must start where the nodes can reach it).
A run that outlives ``timeout`` is killed with its whole process group, so a rank stuck in a
collective after its peer died cannot hang the caller.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

Launcher = Literal["gloo", "mpi"]

# Environment passed to every rank under mpirun (-x); horovodrun forwards the environment.
_FORWARD = ("PATH", "PYTHONPATH", "HOME", "TF_USE_LEGACY_KERAS", "TF_CPP_MIN_LOG_LEVEL",
            "OMP_NUM_THREADS", "HVD_BERT_CACHE", "CUDA_VISIBLE_DEVICES")


@dataclass
class RunResult:
    """The outcome of a distributed run."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def explain(self) -> str:
        head = f"command: {' '.join(self.command)}\nexit code: {self.returncode}"
        if self.timed_out:
            head += " (killed after the timeout)"
        return f"{head}\n--- stdout ---\n{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-6000:]}"


def tool_path(name: str) -> str:
    """``name`` from the running interpreter's bin folder (the venv), else from PATH."""
    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(here):
        return here
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable} nor on PATH; run scripts/setup.sh "
            f"(or `make setup`) and use the venv's Python")
    return found


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


# What an MPI process's own wiring puts into its environment: OpenMPI's singleton start (a
# process that calls MPI_Init without a launcher, as ``hvd.init()`` does in a plain ``python``)
# sets these with putenv, so every child process inherits them, and an ``mpirun`` started
# with them believes it runs inside that job and exits 1 without a word. A new launch must not
# carry them.
_MPI_WIRING = ("OMPI_MCA_ess", "OMPI_MCA_orte_launch", "OMPI_MCA_orte_precondition_transports",
               "OMPI_MCA_pmix", "OMPI_MCA_orte_ess_num_procs", "OMPI_MCA_orte_hnp_uri",
               "OMPI_MCA_orte_ess_jobid",
               "OMPI_MCA_orte_ess_vpid", "OMPI_MCA_orte_num_nodes", "ORTE_SCHIZO_DETECTION",
               "OMPI_APP_CTX_NUM_PROCS", "OMPI_NUM_APP_CTX", "OMPI_FIRST_RANKS", "OMPI_UNIVERSE_SIZE")
_MPI_WIRING_PREFIXES = ("PMIX_", "OMPI_COMM_WORLD_", "OMPI_MCA_ess_base_")


def without_mpi_wiring(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the variables of an enclosing MPI job or singleton (see ``_MPI_WIRING``)."""
    return {k: v for k, v in env.items() if k not in _MPI_WIRING and not k.startswith(_MPI_WIRING_PREFIXES)}


def mpi_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a launcher (``mpirun`` or ``horovodrun``): no enclosing MPI job's
    wiring, and, as root, what OpenMPI refuses to run without."""
    from hvd_bert.cluster.horovod import DEFAULTS_MARK, marked_defaults
    out = without_mpi_wiring(os.environ if env is None else env)
    for k in [*marked_defaults(out), DEFAULTS_MARK]:  # this process's Horovod defaults are
        out.pop(k, None)                                  # not the new job's (its launcher's)
    if is_root():
        out.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        out.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # Containers often forbid the ptrace-based single-copy path of the shared-memory transport.
    out.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    return out


def command(argv: Sequence[str], np: int = 2, launcher: Launcher = "gloo",
            python: str | None = None, extra_env: Sequence[str] = (), hosts: str | None = None,
            nic: str | None = None, prefix: Sequence[str] = ()) -> list[str]:
    """The launch command for ``python argv...`` on ``np`` processes (on this host by default)."""
    if np < 1:
        raise ValueError(f"np must be >= 1, got {np}")
    py = python or sys.executable
    if launcher == "gloo":
        # horovodrun itself, its build check answered without importing TensorFlow
        # (hvd_bert.cluster.horovodrun)
        cmd = [sys.executable, "-m", "hvd_bert.cluster.horovodrun", "-np", str(np),
               "-H", hosts or f"localhost:{np}", "--gloo"]
        if nic:
            cmd += ["--network-interface", nic]
        return [*prefix, *cmd, py, *argv]
    if launcher == "mpi":
        cmd = [tool_path("mpirun"), "-np", str(np), "--oversubscribe", "--bind-to", "none",
               "--mca", "btl", "self,vader,tcp"]
        if hosts:
            cmd += ["-H", hosts]
        if nic:
            cmd += ["--mca", "btl_tcp_if_include", nic, "--mca", "oob_tcp_if_include", nic]
        if is_root():
            cmd.append("--allow-run-as-root")
        for var in (*_FORWARD, *extra_env):
            if var in os.environ or var in extra_env:
                cmd += ["-x", var]
        return [*prefix, *cmd, py, *argv]
    raise ValueError(f"launcher must be 'gloo' or 'mpi', got {launcher!r}")


def run(argv: Sequence[str], np: int = 2, launcher: Launcher = "gloo", timeout: float = 300,
        env: Mapping[str, str] | None = None, cwd: str | None = None, hosts: str | None = None,
        nic: str | None = None, prefix: Sequence[str] = (), python: str | None = None) -> RunResult:
    """Run ``python argv...`` on ``np`` processes and wait at most ``timeout`` seconds (``python``:
    this interpreter by default; a wrapper such as ``scripts/container.sh`` may take its place)."""
    full_env = mpi_env(env)
    # Each run gets its own OpenMPI session folder: concurrent jobs on one machine otherwise
    # share /tmp/ompi.<host>.<uid> and can trip over each other.
    session = tempfile.mkdtemp(prefix="hvd_bert-ompi-")
    full_env["OMPI_MCA_orte_tmpdir_base"] = session
    # -x only what the caller set or changed (local ranks inherit mpirun's environment; passing
    # every variable as -x NAME makes mpirun fail silently on some environments)
    extra = [k for k, v in (env or {}).items() if k not in _FORWARD and os.environ.get(k) != v]
    extra.append("OMPI_MCA_orte_tmpdir_base")
    cmd = command(argv, np, launcher, python=python, extra_env=extra, hosts=hosts, nic=nic, prefix=prefix)
    try:
        return _run(cmd, full_env, cwd, timeout)
    finally:
        shutil.rmtree(session, ignore_errors=True)


def _run(cmd: list[str], full_env: dict, cwd: str | None, timeout: float) -> RunResult:
    # stdin from /dev/null: mpirun forwards stdin to rank 0, and may run where there is none
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return RunResult(cmd, proc.returncode, out, err, False)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return RunResult(cmd, proc.returncode if proc.returncode is not None else -9, out, err, True)
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"  # (what the Kubeflow MPI Operator sets in the launcher)


def hosts_from_env(env=None) -> str | None:
    """The hosts and slots of the hostfile OpenMPI is pointed at (``OMPI_MCA_orte_default_hostfile``,
    as the Kubeflow MPI Operator sets it: lines ``<host> slots=<n>``), as ``-H``'s
    ``host:n,...``; None when the variable is unset. A hostfile that cannot be read or says
    something else is a ValueError naming it."""
    path = (os.environ if env is None else env).get(HOSTFILE_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            text = f.read(1 << 20)
    except OSError as e:
        raise ValueError(f"{HOSTFILE_ENV}={path} cannot be read ({e.strerror}): give the hostfile mpirun "
                         f"should use, or unset {HOSTFILE_ENV} and give -H") from None
    hosts = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        slots = [w.removeprefix("slots=") for w in words[1:] if w.startswith("slots=")]
        other = [w for w in words[1:] if not re.fullmatch(r"(max_)?slots=[0-9]+", w)]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*", words[0]) or len(slots) > 1 or other \
                or (slots and int(slots[0]) < 1):
            raise ValueError(f"{path}, line {n}: {line.strip()[:80]!r} is not '<host> slots=<n>' (OpenMPI's "
                             f"hostfile, as the MPI Operator writes it)")
        hosts.append(f"{words[0]}:{int(slots[0]) if slots else 1}")
    if not hosts:
        raise ValueError(f"{path} ({HOSTFILE_ENV}) names no host: give the hostfile mpirun should use")
    return ",".join(hosts)
