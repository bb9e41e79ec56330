"""``hvd-bert doctor``: what is installed, what the Horovod build contains, and whether a
2-process allreduce works in each framework under each controller, with the fix for what
does not."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys

from hvd_bert.cluster import launch

SETUP_FIX = "run `bash scripts/setup.sh` (or `make setup`) in the hvd_bert checkout"
REBUILD_FIX = ("rebuild Horovod: remove ~/.cache/hvd_bert/wheels and .venv/.hvd_bert_horovod, "
               "then run `bash scripts/setup.sh`")

_PROBE = r"""
import json, os, sys
import hvd_bert
out = {}
fw = sys.argv[1]
try:
    if fw == "torch":
        import torch as m
        out["version"] = m.__version__
        import horovod.torch as h
    else:
        import tensorflow as m
        out["version"] = m.__version__
        import tf_keras
        out["tf_keras"] = tf_keras.__version__
        out["keras_is_tf_keras"] = m.keras.layers.Dense.__module__.startswith("tf_keras")
        import horovod.tensorflow as h
        import horovod.tensorflow.keras  # noqa: F401
    import horovod
    out["horovod"] = horovod.__version__
    out["build"] = {k: bool(getattr(h, k + "_built")()) for k in
                    ("mpi", "gloo", "nccl", "ddl", "ccl", "cuda", "rocm")}
except Exception as e:  # report, do not crash: the doctor explains it
    out["error"] = f"{type(e).__name__}: {e}"
print("PROBE" + json.dumps(out))
"""


def _probe(framework: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE, framework], capture_output=True,
                           text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "importing the framework took over 180 s"}
    for line in p.stdout.splitlines():
        if line.startswith("PROBE"):
            return json.loads(line[5:])
    return {"error": f"the probe crashed (exit {p.returncode}): {p.stderr.strip()[-500:]}"}


def _mpi_versions() -> tuple[str, str]:
    mpirun = shutil.which("mpirun")
    mpirun_v = "missing"
    if mpirun:
        try:
            mpirun_v = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                                      timeout=30).stdout.splitlines()[0].strip()
        except (subprocess.SubprocessError, IndexError, OSError):
            mpirun_v = "present, but `mpirun --version` failed"
    try:
        from mpi4py import MPI  # noqa: PLC0415

        import mpi4py
        lib = MPI.Get_library_version().splitlines()[0].strip().rstrip(",")
        mpi4py_v = f"{mpi4py.__version__} ({lib})"
    except Exception as e:  # noqa: BLE001
        mpi4py_v = f"missing ({type(e).__name__}: {e})"
    return mpirun_v, mpi4py_v


def _row(label: str, value: str) -> None:
    print(f"  {label:<22} {value}")


def _mark(ok: bool) -> str:
    return "[X]" if ok else "[ ]"


def _lock_row(problems: list, root: str) -> None:
    """Which lock file the set-up installed this environment from, its digest, and whether what
    is installed is still what it pins (``hvd_bert.cluster.lock``)."""
    from hvd_bert.cluster import lock as L

    got = L.installed_lock()
    if got is None:
        _row("lock", "none recorded (this environment was not set up by scripts/setup.sh)")
        return
    name, sha = got
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        _row("lock", f"{name} {sha[:16]} (set-up's; the file is not beside this hvd_bert)")
        return
    now = L.digest(path)
    differ = L.differences(L.read_lock(path))
    said = f"{name} {sha[:16]}"
    if now != sha[:16]:
        said += f" (the file is {now} now)"
        problems.append((f"{name} changed since the set-up installed from it", SETUP_FIX))
    _row("lock", said + (f"; {len(differ)} package(s) differ: {', '.join(differ[:3])}" if differ
                         else "; every package as it pins"))
    if differ:
        problems.append((f"{len(differ)} installed package(s) differ from {name} ({differ[0]})", SETUP_FIX))


def run_doctor(np: int = 2, timeout: float = 180, runs: bool = True) -> int:
    problems: list[tuple[str, str]] = []
    print("hvd_bert doctor")
    print("versions:")
    import numpy

    import hvd_bert
    _row("hvd_bert", f"{hvd_bert.__version__} ({os.path.dirname(hvd_bert.__file__)})")
    _row("python", f"{platform.python_version()} ({sys.executable})")
    _row("numpy", numpy.__version__)
    probes = {fw: _probe(fw) for fw in ("torch", "tensorflow")}
    for fw, pr in probes.items():
        if "version" in pr:
            extra = f" + tf-keras {pr['tf_keras']}" if "tf_keras" in pr else ""
            _row(fw, pr["version"] + extra)
        else:
            _row(fw, "missing")
    hvd_versions = {pr.get("horovod") for pr in probes.values() if pr.get("horovod")}
    _row("horovod", ", ".join(sorted(hvd_versions)) or "missing")
    mpirun_v, mpi4py_v = _mpi_versions()
    _row("mpirun", mpirun_v)
    _row("mpi4py", mpi4py_v)
    _row("TF_USE_LEGACY_KERAS", os.environ.get("TF_USE_LEGACY_KERAS", "unset"))
    _lock_row(problems, os.path.dirname(os.path.dirname(hvd_bert.__file__)))
    if mpirun_v == "missing":
        problems.append(("mpirun is missing", "apt-get install -y openmpi-bin libopenmpi-dev"))
    if mpi4py_v.startswith("missing"):
        problems.append(("mpi4py does not load (needed to prepare data across nodes)", SETUP_FIX))

    print("horovod build:")
    for fw, pr in probes.items():
        if "error" in pr:
            _row(fw, f"NOT AVAILABLE: {pr['error']}")
            fix = SETUP_FIX if "version" not in pr else REBUILD_FIX
            problems.append((f"Horovod for {fw} does not load ({pr['error']})", fix))
            continue
        b = pr["build"]
        _row(fw, f"controllers: {_mark(b['mpi'])} MPI {_mark(b['gloo'])} Gloo; tensor operations: "
                 f"{_mark(b['nccl'])} NCCL {_mark(b['ddl'])} DDL {_mark(b['ccl'])} CCL "
                 f"{_mark(b['mpi'])} MPI {_mark(b['gloo'])} Gloo; GPU: {_mark(b['cuda'])} CUDA "
                 f"{_mark(b['rocm'])} ROCm")
        if fw == "tensorflow" and not pr.get("keras_is_tf_keras", False):
            problems.append(("tf.keras is Keras 3, not tf-keras: Horovod's Keras integration fails",
                             "export TF_USE_LEGACY_KERAS=1 before TensorFlow is imported "
                             "(importing hvd_bert first does it) and install tf-keras==2.21.0"))
        for ctl in ("mpi", "gloo"):
            if not b[ctl]:
                problems.append((f"Horovod for {fw} was built without {ctl.upper()}", REBUILD_FIX))

    ok_runs = 0
    if runs:
        print(f"runs ({np} processes, allreduce of rank + 1):")
        for fw, pr in probes.items():
            if "error" in pr:
                _row(f"{fw} / -", "skipped: Horovod does not load")
                continue
            for ctl in ("gloo", "mpi"):
                if not pr["build"][ctl] or (ctl == "mpi" and mpirun_v == "missing"):
                    _row(f"{fw} / {ctl}", "skipped: not available")
                    continue
                res, lines, note = _check_run(fw, ctl, np, timeout)
                if res.ok and len(lines) == np:
                    ok_runs += 1
                    _row(f"{fw} / {ctl}", f"OK: {np} ranks agree ({lines[0].split('allreduce=')[1]}){note}")
                else:
                    why = "timed out" if res.timed_out else f"exit code {res.returncode}"
                    if res.returncode == 0 and not res.timed_out:
                        why = f"{len(lines)} of {np} ranks reported"
                    _row(f"{fw} / {ctl}", f"FAILED ({why})")
                    tail = [ln for ln in (res.stdout + "\n" + res.stderr).splitlines() if ln.strip()][-6:]
                    for t in tail or ["(the launcher printed nothing)"]:
                        print(f"      {t[:200]}")
                    problems.append((f"{np}-process {fw} allreduce over {ctl} failed ({why})",
                                     _run_fix(ctl, res)))
    print()
    return _verdict(problems, f"everything works: {ok_runs} distributed runs passed")


def _verdict(problems: list[tuple[str, str]], success: str) -> int:
    """The closing lines: each problem with its fix (exit status 1), or ``success`` (0)."""
    if problems:
        print(f"{len(problems)} problem(s):")
        for what, fix in problems:
            print(f"  - {what}\n    fix: {fix}")
        return 1
    print(success)
    return 0


def _check_run(fw: str, ctl: str, np: int, timeout: float):
    """One 2-process allreduce; ranks report to files. A launch that produced no rank result
    at all (seen rarely with mpirun inside long test sessions: exit 1, no output) is tried once
    more, and the report says so."""
    import tempfile

    note = ""
    for attempt in (1, 2):
        with tempfile.TemporaryDirectory(prefix="hvd_bert-doctor-") as out:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", HVD_BERT_DOCTOR_OUT=out)
            res = launch.run(["-m", "hvd_bert.cluster.doctor_worker", fw], np=np, launcher=ctl,
                             timeout=timeout, env=env)
            lines = sorted(open(os.path.join(out, f)).read().strip() for f in os.listdir(out))
        if lines or res.timed_out or attempt == 2:
            return res, lines, note
        note = f"; passed on a retry: the first launch exited {res.returncode} with no rank result"
    return res, lines, note


def _run_fix(ctl: str, res: launch.RunResult) -> str:
    text = res.stdout + res.stderr
    if "run-as-root" in text or "as root" in text:
        return "as root, pass --allow-run-as-root to mpirun or export OMPI_ALLOW_RUN_AS_ROOT=1 " \
               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
    if "not enough slots" in text:
        return "ask for fewer processes (--np) or add --oversubscribe to mpirun"
    if res.timed_out:
        return ("a rank hung: check that localhost resolves and that loopback TCP is allowed; "
                "set HOROVOD_GLOO_IFACE=lo (gloo) or pass --mca btl_tcp_if_include lo (mpi)")
    return "read the rank output above; " + SETUP_FIX


# ----------------------------------------------------------------------------- several hosts
_HOST_PROBE = r"""
import ipaddress, json, os, socket, subprocess, sys
out = {"python": sys.executable, "hostname": socket.gethostname(), "cwd_exists": os.path.isdir(sys.argv[1]),
       "marker": os.path.isfile(sys.argv[2])}
try:
    import hvd_bert, horovod
    out.update(hvd_bert=hvd_bert.__version__, horovod=horovod.__version__)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
try:
    lines = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    out["ifaces"] = [[p[1], str(ipaddress.ip_interface(p[3]).network)] for p in
                     (ln.split() for ln in lines.splitlines()) if len(p) > 3 and p[1] != "lo"]
except OSError:
    out["ifaces"] = []
print("HOSTPROBE" + json.dumps(out))
"""


def parse_hosts(spec: str) -> list[tuple[str, int]]:
    """``h1:2,h2:2`` -> ``[("h1", 2), ("h2", 2)]`` (a host without slots has 1)."""
    hosts = []
    for part in spec.split(","):
        name, _, slots = part.strip().partition(":")
        if not name or (slots and not slots.isdigit()) or (slots and int(slots) < 1):
            raise ValueError(f"--hosts {spec!r}: give host:slots,host:slots (e.g. node1:8,node2:8)")
        hosts.append((name, int(slots or 1)))
    return hosts


def _ssh(host: str, command: str, timeout: float, port: int | None) -> subprocess.CompletedProcess:
    opts = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "StrictHostKeyChecking=accept-new"]
    if port:
        opts += ["-p", str(port)]
    return subprocess.run(["ssh", *opts, host, command], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def run_host_checks(spec: str, timeout: float = 180, ssh_port: int | None = None) -> int:
    """``hvd-bert doctor --hosts h1:2,h2:2``: what a multi-node launch needs, host by host, with
    the fix for what is missing: passwordless ssh, this Python environment at the same path
    with the same hvd_bert and Horovod, this folder on a shared file system (data and run
    folders), a network every host is on (the interface to pass), and then a real allreduce
    across all the hosts' slots over Gloo."""
    import contextlib
    import shlex
    import tempfile

    import hvd_bert

    hosts = parse_hosts(spec)
    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    cwd = os.getcwd()
    print(f"hvd_bert doctor: {len(hosts)} host(s), {sum(s for _, s in hosts)} slot(s); from {cwd}")
    probes = {}
    try:  # a file only this folder has: seen from a host, the folder is shared with it
        marker = tempfile.NamedTemporaryFile(dir=cwd, prefix=".hvd_bert-doctor-", delete=True)
    except OSError:
        marker = None
        notes.append(f"cannot write in {cwd}: the shared-folder check was skipped")
    with marker or contextlib.nullcontext():
        for host, _ in hosts:
            cmd = " ".join(shlex.quote(a) for a in (sys.executable, "-c", _HOST_PROBE, cwd,
                                                      marker.name if marker else "/nonexistent"))
            try:
                res = _ssh(host, cmd, timeout, ssh_port)
            except subprocess.TimeoutExpired:
                _row(host, "FAILED: ssh timed out")
                problems.append((f"ssh to {host} timed out", "check that the host is up and reachable"))
                continue
            text = res.stdout + res.stderr
            if res.returncode == 255:
                why = (res.stderr.strip().splitlines() or ["no output"])[-1]
                _row(host, f"FAILED: {why}")
                if "ermission denied" in why or "erification failed" in why:
                    problems.append((f"cannot log in to {host} without a password ({why})",
                                     f"passwordless ssh from here to every host: ssh-keygen, then "
                                     f"ssh-copy-id {host}; horovodrun and mpirun log in this way"))
                else:
                    problems.append((f"cannot reach {host}'s ssh server ({why})",
                                     "check the host name, that sshd runs there (and on which port: "
                                     "--ssh-port), and that the network lets ssh through"))
                continue
            line = next((ln for ln in res.stdout.splitlines() if ln.startswith("HOSTPROBE")), None)
            if line is None:
                _row(host, f"FAILED: {sys.executable} does not run there")
                last = (text.strip().splitlines() or [""])[-1]
                problems.append((f"{host} has no {sys.executable} ({last})",
                                 "the same environment at the same path on every node: install the venv "
                                 "there at this path, share it, or run in the same container image"))
                continue
            pr = probes[host] = json.loads(line[len("HOSTPROBE"):])
            if "error" in pr:
                _row(host, f"FAILED: hvd_bert does not load ({pr['error']})")
                problems.append((f"hvd_bert or Horovod does not load on {host}", SETUP_FIX + f" on {host}"))
                continue
            same = pr["hvd_bert"] == hvd_bert.__version__
            shared = "not checked" if marker is None else ("shared" if pr["marker"] else "NOT shared")
            _row(host, f"ssh OK; {pr['hostname']}; hvd_bert {pr['hvd_bert']}, horovod {pr['horovod']}; "
                       f"this folder {shared}")
            if not same:
                problems.append((f"{host} has hvd_bert {pr['hvd_bert']}, here {hvd_bert.__version__}",
                                 "install the same version on every node"))
            if marker is not None and not pr["marker"]:
                notes.append(f"{cwd} is not shared with {host}: put data and run folders on a shared file "
                             f"system (every rank reads its shards; rank 0 writes checkpoints), or copy the "
                             f"data to the same path on every node")
    iface = None
    if probes and len(probes) == len(hosts):
        nets = [set(map(tuple, pr["ifaces"])) for pr in probes.values()]
        by_net: dict[str, set] = {}
        for pr in probes.values():
            for name, net in pr["ifaces"]:
                by_net.setdefault(net, set()).add(name)
        shared = [net for net in by_net if all(any(n == net for _, n in s) for s in nets)]
        if not shared:
            problems.append(("no IPv4 network is common to all hosts", "connect the hosts on one network"))
        else:
            net = shared[0]
            names = by_net[net]
            iface = next(iter(names)) if len(names) == 1 else None
            _row("network", f"{net} on every host (interface {', '.join(sorted(names))})")
            if iface:
                print(f"    pass it on: horovodrun --network-interface {iface} (or HOROVOD_GLOO_IFACE="
                      f"{iface}); mpirun --mca btl_tcp_if_include {net} -x NCCL_SOCKET_IFNAME={iface}")
    if not problems:
        total = sum(s for _, s in hosts)
        cmd = [launch.tool_path("horovodrun"), "-np", str(total), "-H", spec, "--gloo"]
        if ssh_port:
            cmd += ["-p", str(ssh_port)]
        if iface:
            cmd += ["--network-interface", iface]
        cmd += [sys.executable, "-m", "hvd_bert.cluster.doctor_worker", "torch"]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                                 stdin=subprocess.DEVNULL)
            ranks = [ln for ln in res.stdout.splitlines() if "doctor-rank" in ln]
            ok = res.returncode == 0 and len(ranks) == total
        except subprocess.TimeoutExpired:
            res, ranks, ok = None, [], False
        if ok:
            got = ranks[0].split("allreduce=")[1]
            _row("allreduce", f"OK: {total} ranks on {len(hosts)} hosts agree ({got})")
        else:
            why = "timed out" if res is None else f"exit code {res.returncode}, {len(ranks)} of {total} ranks"
            _row("allreduce", f"FAILED ({why})")
            if res is not None:
                for t in [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()][-6:]:
                    print(f"      {t[:200]}")
            problems.append((f"the {total}-rank allreduce across the hosts failed ({why})",
                             "check that the hosts reach each other on the network above (firewall) "
                             "and pass the interface as shown"))
    print()
    for n in notes:
        print(f"note: {n}")
    return _verdict(problems, f"the hosts are ready: {sum(s for _, s in hosts)} ranks")
