"""Shared test settings: one thread per process (2 ranks share 2 cores), quiet TensorFlow."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def pytest_collection_modifyitems(session, config, items):
    """tfrecord (tests/common, tests/pt) and TensorFlow (tests/tf) cannot share a process."""
    import pathlib

    import pytest

    tf_dir = pathlib.Path(__file__).parent / "tf"
    in_tf = {pathlib.Path(str(i.fspath)).is_relative_to(tf_dir) for i in items}
    if len(in_tf) == 2:
        raise pytest.UsageError("run tests/tf in its own pytest process (tfrecord and TensorFlow cannot "
                                "share one): pytest tests/common tests/pt tests/parallel; pytest tests/tf")
