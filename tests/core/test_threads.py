"""Threads per rank (hvd_bert.train.backend.threads_per_rank): the user's OMP_NUM_THREADS wins
(as in PyTorch and torchrun); otherwise the host's cores are shared between its local ranks."""

import os

from hvd_bert.train.backend import threads_per_rank


def test_omp_num_threads_wins():
    assert threads_per_rank(2, {"OMP_NUM_THREADS": "3"}) == 3
    assert threads_per_rank(64, {"OMP_NUM_THREADS": "1"}) == 1


def test_the_cores_are_shared_between_the_local_ranks_otherwise():
    cores = os.cpu_count() or 1
    for env in ({}, {"OMP_NUM_THREADS": ""}, {"OMP_NUM_THREADS": "0"}, {"OMP_NUM_THREADS": "four"}):
        assert threads_per_rank(1, env) == cores
        assert threads_per_rank(cores * 4, env) == 1  # never 0
