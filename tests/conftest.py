"""Shared test settings: one thread per process (2 ranks share 2 cores), quiet TensorFlow."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "multinode: runs on several fake nodes (network namespaces); "
                                       "select with -m multinode, skip with -m 'not multinode'")
    config.addinivalue_line("markers", "readme: runs every README.md code block as written (tests/readme); "
                                       "select with -m readme")
