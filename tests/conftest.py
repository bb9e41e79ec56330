"""Shared test settings: one thread per process (2 ranks share 2 cores), quiet TensorFlow."""

import os
import random
import sys

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


@pytest.fixture(autouse=True)
def _fixed_global_seeds():
    """A test that draws from a global generator (random, numpy's, PyTorch's, TensorFlow's)
    gets the same numbers in every run, whichever tests ran before it on its xdist worker:
    seed 0, or tests/bounds/measure.py's shift of it (tests/closeness.py)."""
    from closeness import seed_of
    s = seed_of(0)
    random.seed(s)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(s)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(s)
    if "tensorflow" in sys.modules and hasattr(sys.modules["tensorflow"], "random"):
        sys.modules["tensorflow"].random.set_seed(s)


def pytest_configure(config):
    config.addinivalue_line("markers", "multinode: runs on several fake nodes (network namespaces); "
                                       "select with -m multinode, skip with -m 'not multinode'")
    config.addinivalue_line("markers", "readme: runs every README.md code block as written (tests/readme); "
                                       "select with -m readme")
    config.addinivalue_line("markers", "container: builds and runs hvd_bert's image with podman (root); "
                                       "select with -m container")


# The modules that take longest start first, so that the two workers of the multi-process phase
# (scripts/run_tests.sh, --dist loadfile) do not end with one long module running alone; the
# rest keep their order. From the suite's report (make test prints the slowest tests).
LONGEST_FIRST = ["tests/readme/test_readme.py", "tests/parallel/test_elastic.py",
                 "tests/parallel/test_multinode.py", "tests/parallel/test_faults.py",
                 "tests/parallel/test_engine_contract.py", "tests/parallel/test_pretrain.py"]


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=rank)  # stable: each module's tests stay in their order
