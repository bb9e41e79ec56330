"""`hvd-bert doctor` on this installation: versions, build contents, and 4 real runs."""

import subprocess
import sys


def test_doctor_reports_a_working_install():
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "doctor"], capture_output=True,
                       text=True, timeout=600)
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    for needle in ("torch                  2.13.0", "tensorflow             2.21.0 + tf-keras 2.21.0",
                   "horovod                0.28.1", "Open MPI", "[X] MPI [X] Gloo",
                   "torch / gloo           OK", "torch / mpi            OK",
                   "tensorflow / gloo      OK", "tensorflow / mpi       OK",
                   "everything works: 4 distributed runs passed"):
        assert needle in out, f"{needle!r} missing from:\n{out}"


def test_doctor_names_the_fix_when_a_run_fails():
    # A run that cannot finish in time must be reported with a fix, not hang the doctor.
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "doctor", "--timeout", "0.5"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert "FAILED (timed out)" in p.stdout and "fix:" in p.stdout
