"""`hvd-bert simulate`: the BERT-Large projection, and calibration from a real 2-rank run."""

import re
import subprocess
import sys


def simulate(*args, timeout=600):
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "simulate", *args], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_bert_large_recipe_projection():
    out = simulate("--fp16", "--bert-recipe", "--gpus", "16", "1472")
    minutes = float(re.search(r"on 1472 GPUs: ([\d.]+) minutes", out).group(1))
    assert 30 < minutes < 80  # the published run took 47 minutes; see BENCHMARKS.md
    assert "phase 1: 7038 steps of 65536 x 128" in out and "phase 2: 1563 steps of 32768 x 512" in out


def test_calibration_fits_this_machine():
    out = simulate("--calibrate", "--workload", "ncf", "--algorithm", "ring", "--gpus", "1", "2")
    m = re.search(r"fitted ring model: alpha ([\d.]+) us, bandwidth ([\d.]+) GB/s", out)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0
    assert out.count(" KiB ") == 8  # eight measured sizes


def test_bad_calibrate_hosts_is_one_line_and_exit_2():
    p = subprocess.run([sys.executable, "-m", "hvd_bert", "simulate", "--calibrate", "--calibrate-hosts",
                        "node1:x"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert "--calibrate-hosts 'node1:x': give host:slots,host:slots" in p.stderr
