"""Checkpoint files: atomicity, naming, newest, retention."""

import pytest

from hvd_bert.common.checkpoint import (atomic_write, checkpoint_path, latest_checkpoint,
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
