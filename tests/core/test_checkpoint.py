"""Checkpoint files: atomicity, naming, newest, retention."""

import os

import pytest

from hvd_bert.files import atomic_write
from hvd_bert.train.checkpoint import (checkpoint_path, latest_checkpoint,
                                        list_checkpoints, prune)


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "sub" / "f.bin"
    atomic_write(p, lambda t: t.write_bytes(b"one"))
    atomic_write(p, lambda t: t.write_bytes(b"two"))
    assert p.read_bytes() == b"two"
    assert [x.name for x in p.parent.iterdir()] == ["f.bin"]


def test_failed_write_leaves_previous_file_and_no_temporary(tmp_path):
    p = tmp_path / "f.bin"
    atomic_write(p, lambda t: t.write_bytes(b"good"))

    def broken(t):
        t.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(p, broken)
    assert p.read_bytes() == b"good"
    assert [x.name for x in tmp_path.iterdir()] == ["f.bin"]


def test_names_newest_and_prune(tmp_path):
    for s in (5, 100, 20):
        checkpoint_path(tmp_path, s, "pt").write_bytes(b"x")
    (tmp_path / ".ckpt-00000200.pt.tmp-1").write_bytes(b"partial")  # ignored
    checkpoint_path(tmp_path, 300, "h5").write_bytes(b"x")  # other framework: ignored
    assert [s for s, _ in list_checkpoints(tmp_path, "pt")] == [5, 20, 100]
    assert latest_checkpoint(tmp_path, "pt").name == "ckpt-00000100.pt"
    removed = prune(tmp_path, "pt", keep=2)
    assert [p.name for p in removed] == ["ckpt-00000005.pt"]
    assert [s for s, _ in list_checkpoints(tmp_path, "pt")] == [20, 100]


def test_missing_folder_has_no_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path / "nope", "pt") is None


def test_a_second_job_on_a_locked_run_folder_is_refused_naming_the_holder(tmp_path):
    import subprocess
    import sys

    from hvd_bert.train.checkpoint import lock_run_folder

    held = lock_run_folder(tmp_path / "run")
    code = ("from hvd_bert.train.checkpoint import lock_run_folder, RunFolderBusy\n"
            f"try:\n    lock_run_folder({str(tmp_path / 'run')!r})\n"
            "except RunFolderBusy as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert f"in use by another job (pid {os.getpid()} on " in out and "another train.output_dir" in out
    held.close()  # released (as when the holder exits or crashes): the next job takes it
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out == ""


def test_a_released_lock_leaves_no_file_and_the_next_job_locks_anew(tmp_path):
    from hvd_bert.train.checkpoint import LOCK_NAME, RunFolderBusy, lock_run_folder, release_run_folder

    held = lock_run_folder(tmp_path)
    release_run_folder(held)
    assert not (tmp_path / LOCK_NAME).exists()
    again = lock_run_folder(tmp_path)  # a new file, locked
    with pytest.raises(RunFolderBusy):
        lock_run_folder(tmp_path)
    release_run_folder(again)


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    import subprocess
    import sys

    from hvd_bert.train.checkpoint import remove_stale_temporaries

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f".ckpt-00000004.pt.tmp-{dead}").write_bytes(b"half")
    (tmp_path / f".ckpt-00000004.tf.tmp-{dead}").mkdir()
    mine = tmp_path / f".ckpt-00000006.pt.tmp-{os.getpid()}"
    mine.write_bytes(b"being written")
    (tmp_path / "ckpt-00000002.pt").write_bytes(b"complete")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == [f".ckpt-00000004.pt.tmp-{dead}",
                                               f".ckpt-00000004.tf.tmp-{dead}"]
    assert mine.exists() and (tmp_path / "ckpt-00000002.pt").exists()


def test_atomic_write_never_writes_through_a_planted_link(tmp_path):
    """A link planted under the temporary name or the final name is replaced, never followed."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / f".config.json.tmp-{os.getpid()}").symlink_to(victim)
    (run / "metrics.json").symlink_to(victim)
    atomic_write(run / "config.json", lambda t: t.write_text("new"))
    atomic_write(run / "metrics.json", lambda t: t.write_text("new"))
    assert victim.read_text() == "keep"
    assert (run / "config.json").read_text() == (run / "metrics.json").read_text() == "new"
    assert not (run / "metrics.json").is_symlink() and sorted(p.name for p in run.iterdir()) == [
        "config.json", "metrics.json"]


def test_a_run_folder_called_like_a_checkpoint_is_not_one(tmp_path):
    from hvd_bert.train.checkpoint import is_checkpoint_name
    assert is_checkpoint_name(tmp_path / "ckpt-00000012.pt", "pt")
    assert is_checkpoint_name("ckpt-00000012.tf", "tf") and not is_checkpoint_name("ckpt-00000012.tf", "pt")
    assert not is_checkpoint_name(tmp_path / "ckpt-0", "pt") and not is_checkpoint_name("ckpt-best", "tf")


def test_the_default_format_is_sharded_wherever_there_is_more_than_one_rank():
    from hvd_bert.config import TrainConfig
    from hvd_bert.train.checkpoint import checkpoint_format

    assert TrainConfig().checkpoint_format == "auto"
    assert checkpoint_format("auto", 1) == "consolidated"
    assert [checkpoint_format("auto", n) for n in (2, 3, 1472)] == ["sharded"] * 3
    assert checkpoint_format("auto", 1, elastic=True) == "sharded"  # (its world may grow)
    for setting in ("consolidated", "sharded"):  # a setting given is the setting
        assert {checkpoint_format(setting, n, e) for n in (1, 4) for e in (False, True)} == {setting}
