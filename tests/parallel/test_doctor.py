"""`hvd-bert doctor`'s failures and launch corner cases. Its report on a working installation
(versions, build contents, 4 real runs) is checked in the image (test_container_image.py, the
squashfs root); on this machine the README's block runs it, and it exits 0 only when all 4 runs
pass."""

import subprocess
import sys


def test_an_mpi_launch_from_below_an_mpi_singleton_works():
    """What made the doctor's mpirun exit 1 with no output inside the full suite: a test that
    calls ``hvd.init()`` in the pytest process starts an OpenMPI singleton, which putenv()s its
    wiring (OMPI_MCA_ess, PMIX_*, ...). Every later child inherits it, and an mpirun started
    from such a child believed it was inside that job. The launcher now drops that wiring."""
    child = ("import sys; from hvd_bert.cluster import launch; "
             "r = launch.run(['-c', 'import os, horovod.torch as hvd; hvd.init(); "
                 "os.write(1, b\"SIZE %d\\\\n\" % hvd.size())'], "
             "np=2, launcher='mpi', timeout=120); print(r.explain()); sys.exit(0 if r.ok else 1)")
    parent = ("import os, subprocess, sys; import horovod.torch as hvd; hvd.init(); "
              "assert hvd.size() == 1 and hvd.mpi_enabled(); "
              f"sys.exit(subprocess.run([sys.executable, '-c', {child!r}]).returncode)")
    p = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.count("SIZE 2") == 2, p.stdout + p.stderr


def test_doctor_names_the_fix_when_a_run_fails():
    # A run that cannot finish in time must be reported with a fix, not hang the doctor.
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "doctor", "--timeout", "0.5"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert "FAILED (timed out)" in p.stdout and "fix:" in p.stdout
    # the lock the venv was set up from, with its digest (what a bug report then names)
    from hvd_bert.cluster.lock import digest
    from pathlib import Path

    lock = Path(__file__).resolve().parents[2] / "requirements-dev.lock"
    assert f"requirements-dev.lock {digest(lock)}; every package as it pins" in p.stdout


def test_doctor_hosts_names_the_unreachable_host_and_the_fix():
    """--hosts checks each host over ssh before any launch; here both are loopback addresses
    with no ssh server on the port (the passing path is exercised by the multi-node tests)."""
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "doctor", "--hosts", "127.0.0.1:2,127.0.0.2:2",
                        "--ssh-port", "9"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "hvd_bert doctor: 2 host(s), 4 slot(s)" in p.stdout
    assert "cannot reach 127.0.0.1's ssh server" in p.stdout and "cannot reach 127.0.0.2's" in p.stdout
    assert "sshd runs there (and on which port: --ssh-port)" in p.stdout and "allreduce" not in p.stdout
    bad = subprocess.run([sys.executable, "-m", "hvd_bert", "doctor", "--hosts", "node1:x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "give host:slots,host:slots" in bad.stderr
