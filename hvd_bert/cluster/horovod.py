"""Where this process sits in a launch, read from the environment (standard library only).

The toolkit takes rank, local rank and size from Horovod. Before ``hvd.init()`` it checks the
launch: under SLURM, a step of several tasks started with plain ``srun`` (no ``--mpi=pmix``)
gives every task its own world of one, and OpenMPI then aborts inside ``MPI_Init`` with a
message that does not say why. :func:`check_launch` turns that into an error with the fix.
"""

from __future__ import annotations

import atexit
import os
import threading

__all__ = ["LaunchError", "check_launch", "check_world", "slurm_hidden_from_mpi", "slurm_tasks"]

_WIRED = ("HOROVOD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


class LaunchError(RuntimeError):
    """The processes were started in a way that cannot form one Horovod job."""


def slurm_tasks(env=None) -> int:
    env = os.environ if env is None else env
    for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"):
        if env.get(var, "").isdigit():
            return int(env[var])
    return 1


def _inside_srun_step(env) -> bool:
    # (SLURM 22.05's `srun --container` gives the container the step's variables, no SLURM_PROCID)
    return "SLURM_STEP_ID" in env


def _wired(env) -> bool:
    return any(v in env for v in _WIRED)


def check_launch(env=None) -> None:
    """Raise :class:`LaunchError` for a multi-task SLURM step without MPI/PMIx wiring, or when
    MPI's scratch space is full (``launch.scratch_problem``)."""
    from hvd_bert.cluster.resources import scratch_problem

    env = os.environ if env is None else env
    scratch = scratch_problem(env)
    if scratch:  # (before MPI_Init, which otherwise prints dozens of lines of its own)
        raise LaunchError(scratch)
    n = slurm_tasks(env)
    if _inside_srun_step(env) and n > 1 and not _wired(env):
        if "SLURM_CONTAINER" in env and "SLURM_PROCID" not in env:
            raise LaunchError(
                f"this SLURM job step has {n} tasks in containers (srun --container) but SLURM gave "
                f"them no task wiring (no SLURM_PROCID, no PMIx: SLURM 22.05 runs OCI containers "
                f"with one task per node and the step's environment only), so every task would "
                f"train alone. Start each task's rank through scripts/container.sh exec "
                f"(HVD_BERT_IMAGE=image in slurm/*.sbatch), use Pyxis, or SLURM 23.02 or newer")
        raise LaunchError(
            f"this SLURM job step has {n} tasks but no MPI/PMIx wiring (task {env.get('SLURM_PROCID')}): "
            f"it was started with plain srun, so every task would train alone. Start it with "
            f"`srun --mpi=pmix ...` (or mpirun / horovodrun inside the allocation)")


def slurm_hidden_from_mpi(env=None) -> list[str]:
    """The SLURM variables to hide from ``MPI_Init`` in a one-task job without MPI/PMIx wiring
    (plain ``srun -n 1``, a batch script's own process, SLURM 22.05's ``srun --container``):
    OpenMPI takes SLURM_NODELIST for a direct launch by srun, finds no PMIx server and aborts
    ("direct launched using srun, but OMPI was not built with SLURM's PMI support"); without
    them it starts as the singleton a one-task job is."""
    env = os.environ if env is None else env
    if _wired(env) or "SLURM_NODELIST" not in env or slurm_tasks(env) != 1:
        return []
    return sorted(k for k in env if k.startswith("SLURM_"))


def check_world(size: int, env=None) -> None:
    """After ``hvd.init()``: the Horovod world must match the SLURM step."""
    from hvd_bert.cluster.resources import scratch_problem

    env = os.environ if env is None else env
    scratch = scratch_problem(env)
    if scratch:  # (before MPI_Init, which otherwise prints dozens of lines of its own)
        raise LaunchError(scratch)
    n = slurm_tasks(env)
    if _inside_srun_step(env) and n > 1 and size != n:
        raise LaunchError(
            f"Horovod sees {size} rank(s) but this SLURM step has {n} tasks; start the step with "
            f"`srun --mpi=pmix` and one task per GPU (--ntasks-per-node = GPUs per node)")


DEFAULTS_MARK = "HVD_BERT_HOROVOD_DEFAULTS"  # NAME=VALUE,... of the defaults this process set


def marked_defaults(env) -> dict[str, str]:
    """hvd_bert's launcher defaults that ``env`` holds as this process or a parent set them
    (after ``apply_horovod_env``, or inherited from a process that initialised Horovod and
    then started a launcher): not the user's own."""
    marked = dict(kv.split("=", 1) for kv in env.get(DEFAULTS_MARK, "").split(",") if "=" in kv)
    return {k: v for k, v in marked.items() if env.get(k) == v}


def _users_own(env) -> set[str]:
    inherited = marked_defaults(env)
    return {k for k in env if k not in inherited}


def horovod_env(hcfg, env=None) -> dict[str, str]:
    """The Horovod environment variables that ``horovod.*`` settings stand for (read by
    ``hvd.init()``, so set before it). Only settings the user gave (not null) are returned;
    a variable the user exported already wins over the config and is reported as such."""
    env = os.environ if env is None else env
    if hcfg is None:
        return {}
    want = {}
    if hcfg.fusion_threshold_mb is not None:
        want["HOROVOD_FUSION_THRESHOLD"] = str(int(hcfg.fusion_threshold_mb * 1024 * 1024))
    if hcfg.cycle_time_ms is not None:
        want["HOROVOD_CYCLE_TIME"] = f"{hcfg.cycle_time_ms:g}"
    if hcfg.cpu_operations is not None:
        want["HOROVOD_CPU_OPERATIONS"] = hcfg.cpu_operations
    if hcfg.hierarchical_allreduce is not None:
        want["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1" if hcfg.hierarchical_allreduce else "0"
    if hcfg.autotune:
        want["HOROVOD_AUTOTUNE"] = "1"
        if hcfg.autotune_log:
            want["HOROVOD_AUTOTUNE_LOG"] = os.path.abspath(os.path.expanduser(hcfg.autotune_log))
    if hcfg.timeline:
        want["HOROVOD_TIMELINE"] = os.path.abspath(os.path.expanduser(hcfg.timeline))
    own = _users_own(env)
    return {k: v for k, v in want.items() if k not in own}


def check_cpu_operations(hcfg, env=None) -> None:
    """MPI CPU operations need an MPI launch: under horovodrun --gloo (which exports
    HOROVOD_CPU_OPERATIONS=gloo itself) the setting could not take effect; and Gloo's under an
    MPI launch crash this Horovod."""
    env = os.environ if env is None else env
    want = getattr(hcfg, "cpu_operations", None) or env.get("HOROVOD_CPU_OPERATIONS", "")
    if want.lower() == "gloo" and mpi_launched(env):
        raise LaunchError("train.horovod.cpu_operations=gloo (HOROVOD_CPU_OPERATIONS=gloo) under an MPI "
                          "launch "
                          "crashes Horovod 0.28.1 (a segfault in its Gloo broadcast, the Gloo context is "
                          "never set up from MPI's): leave it unset (MPI's operations) or launch with "
                          "horovodrun --gloo")
    if want.lower() == "mpi" and gloo_launched(env):
        raise LaunchError("train.horovod.cpu_operations=mpi (HOROVOD_CPU_OPERATIONS=mpi) needs an MPI "
                          "launch, but this job was started by horovodrun with Gloo: launch it with "
                          "mpirun (or horovodrun --mpi), or set train.horovod.cpu_operations=gloo")


def gloo_launched(env=None) -> bool:
    """Started by horovodrun with Gloo (``--gloo``, or elastic): it hands every worker the
    rendezvous address of its Gloo store."""
    env = os.environ if env is None else env
    return "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env


def mpi_launched(env=None) -> bool:
    """Started by mpirun (or ``horovodrun --mpi``, or ``srun --mpi=pmix``), not by horovodrun's Gloo."""
    env = os.environ if env is None else env
    return any(v in env for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE")) and not gloo_launched(env)


# hvd_bert's defaults for a CPU job, per launcher, chosen from benchmarks/train_step.py --sweep
# (BENCHMARKS.md, "2-rank training step"): a 5 ms cycle (with Horovod's 1 ms one every rank
# coordinates 1000 times a second, which slows the compute of micro-batches that communicate
# nothing) and, under an MPI launch, OpenMPI yielding the core while it waits instead of
# spinning on it (the compute threads need it); MPI's CPU operations (shared memory within a
# node) are Horovod's own choice there already and are only named.
CPU_DEFAULTS = {"gloo": {"HOROVOD_CYCLE_TIME": "5"},
                "mpi": {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_CPU_OPERATIONS": "mpi",
                        "OMPI_MCA_mpi_yield_when_idle": "1"}}


def launcher_defaults(hcfg, env=None) -> dict[str, str]:
    """The knobs hvd_bert sets for a CPU job where neither the config nor the user's environment
    does (no cycle time under autotune, which tunes it; nothing under Horovod elastic)."""
    env = os.environ if env is None else env
    if env.get("HOROVOD_ELASTIC") == "1":
        # under Horovod elastic, a 5 ms cycle made every worker that joined abort in Gloo a
        # step or two later (a message longer than the receive: the ranks ran different ops),
        # in both frameworks; Horovod's own defaults are what the elastic tests pass with
        return {}
    chosen = {"HOROVOD_CYCLE_TIME": getattr(hcfg, "cycle_time_ms", None),
              "HOROVOD_CPU_OPERATIONS": getattr(hcfg, "cpu_operations", None)}
    if hcfg is not None and hcfg.autotune:
        chosen["HOROVOD_CYCLE_TIME"] = "tuned"
    return {k: v for k, v in CPU_DEFAULTS["mpi" if mpi_launched(env) else "gloo"].items()
            if chosen.get(k) is None and k not in _users_own(env)}


def apply_horovod_env(hcfg, cpu: bool = False) -> dict[str, str]:
    """Export :func:`horovod_env` into this process (before ``hvd.init()``), and for a CPU job
    (no NCCL) :func:`launcher_defaults`; returns what was exported."""
    for k in marked_defaults(os.environ):  # a parent's defaults were for its own launch
        del os.environ[k]
    os.environ.pop(DEFAULTS_MARK, None)
    extra = horovod_env(hcfg)
    defaults = launcher_defaults(hcfg) if cpu else {}
    if defaults:
        os.environ[DEFAULTS_MARK] = ",".join(f"{k}={v}" for k, v in defaults.items())
    extra.update(defaults)
    os.environ.update(extra)
    return extra


def init_horovod(hvd, horovod_cfg=None, process_sets: bool = False) -> None:
    """``hvd.init()`` once for a framework's Horovod module (``horovod.torch`` or
    ``horovod.tensorflow``), after the launch check and with the ``horovod.*`` settings in the
    environment (Horovod reads them at init); ``process_sets``: allow process sets to be added
    after init (tensor parallelism's groups)."""
    if not hvd.is_initialized():
        if process_sets:
            os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        check_launch()  # plain `srun` without --mpi=pmix: say so before MPI aborts
        apply_horovod_env(horovod_cfg, cpu=not hvd.nccl_built())
        check_cpu_operations(horovod_cfg)
        for path in (os.environ.get("HOROVOD_TIMELINE"), os.environ.get("HOROVOD_AUTOTUNE_LOG")):
            if path:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        hidden = {k: os.environ.pop(k) for k in slurm_hidden_from_mpi()}
        try:
            hvd.init()  # Horovod:
        finally:
            os.environ.update(hidden)
        check_world(hvd.size())
        if os.environ.get("HOROVOD_TIMELINE"):
            atexit.register(_flush_timeline, hvd)
        global _NO_HIERARCHICAL
        # Horovod 0.28 reduces hierarchically only through NCCL (or DDL): on a CPU build it
        # forces the setting off at init, silently (horovod/common/operations.cc)
        _NO_HIERARCHICAL = not hvd.nccl_built()


_NO_HIERARCHICAL = False


def _flush_timeline(hvd, timeout_s: float = 30.0) -> None:
    """At exit, before Horovod's own shutdown (atexit runs in reverse): stop the timeline, which
    waits until its writer has written every queued record. Horovod 0.28's shutdown stops the
    writer first and drops what is still queued (common/timeline.cc), so a short run's timeline
    could end before its first allreduce. In a thread, so that a writer that is gone cannot hold
    the exit."""
    if not hvd.is_initialized():
        return
    def stop() -> None:
        try:
            hvd.stop_timeline()
        except Exception:  # (Horovod already shut down: nothing left to write)
            pass

    t = threading.Thread(target=stop, daemon=True)
    t.start()
    t.join(timeout_s)


HOROVOD_KNOBS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CPU_OPERATIONS",
                 "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG",
                 "HOROVOD_TIMELINE", "OMPI_MCA_mpi_yield_when_idle")


def placement_line(hosts: list[str]) -> str:
    """``world: 4 ranks on 2 hosts: node1 ranks 0-1, node2 ranks 2-3`` from every rank's host
    name in rank order (printed once at the start of a job)."""
    groups: list[list] = []  # [host, first, last] runs of consecutive ranks
    for r, h in enumerate(hosts):
        if groups and groups[-1][0] == h and groups[-1][2] == r - 1:
            groups[-1][2] = r
        else:
            groups.append([h, r, r])
    names = list(dict.fromkeys(hosts))
    parts = [f"{h} rank{'s' if b > a else ''} {a}{f'-{b}' if b > a else ''}" for h, a, b in groups]
    return (f"world: {len(hosts)} rank{'s' if len(hosts) != 1 else ''} on {len(names)} "
            f"host{'s' if len(names) != 1 else ''}: {', '.join(parts)}")


def horovod_settings_line(env=None) -> str:
    """``horovod: HOROVOD_FUSION_THRESHOLD=... HOROVOD_CYCLE_TIME=...`` for the knobs in effect
    (from the config or the environment), printed once at the start of a job."""
    env = os.environ if env is None else env
    ours = marked_defaults(env)
    set_ = [f"{k}={env[k]}" + (" (hvd_bert's default for this launcher)" if k in ours else "")
            for k in HOROVOD_KNOBS if k in env]
    line = "horovod: " + (" ".join(set_) if set_ else "Horovod's defaults (fusion 128 MiB, cycle 1 ms)")
    if _NO_HIERARCHICAL and env.get("HOROVOD_HIERARCHICAL_ALLREDUCE", "0") not in ("", "0"):
        line += (" (hierarchical allreduce ignored: Horovod has it only with NCCL, and this build has "
                 "none, so allreduce stays flat)")
    return line
