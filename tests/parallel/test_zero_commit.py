"""ZeRO's elastic commits bounded by the shard (hvd_bert/pt/zero.py ``commit``/``recover``) under
real ``horovodrun -np 4``: each rank keeps its shard and its ring neighbour's, 2/N of the state;
after the loss of any one rank the survivors' new shards hold exactly the committed values; the
loss of two neighbours is refused on every survivor with one line that says to resume from the
last checkpoint. (A whole elastic run that loses its rank 0 under ZeRO-2 is
tests/parallel/test_elastic.py's.)"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from conftest import launch_ranks  # noqa: E402


@pytest.fixture(scope="module")
def lose(tmp_path_factory):
    root, done = tmp_path_factory.mktemp("commit"), {}

    def get(lost: str):
        if lost not in done:
            done[lost] = launch_ranks("zero_commit.py", [lost or ","], root / f"lost-{lost or 'none'}", np=4)
        return done[lost]
    return get


def test_a_commit_keeps_2_over_n_of_the_state(lose):
    for r in lose("3"):
        assert r["commit_bytes"] == 2 * r["state_bytes"]
        assert r["commit_bytes"] <= 2 * r["total_bytes"] / 4 + 2 * 4 * 2  # (the padding of the last shard)
        assert r["held"] == sorted({r["rank"], (r["rank"] + 1) % 4})


@pytest.mark.parametrize("lost", ["3"])  # (every other one rank, and new worlds of other sizes: tests/core)
def test_the_loss_of_any_one_rank_is_recovered_from_the_survivors(lose, lost):
    survivors = [r for r in lose(lost) if str(r["rank"]) not in lost.split(",")]
    assert [r["error"] for r in survivors] == [None] * len(survivors)
    assert all(r["recovered"] and r["new_world"] == len(survivors) for r in survivors)


def test_the_loss_of_two_neighbours_says_to_resume_from_the_checkpoint(lose):
    survivors = [r for r in lose("1,2") if r["rank"] in (0, 3)]
    errors = {r["error"] for r in survivors}
    assert len(errors) == 1 and "former ranks [2]" in errors.pop()  # (rank 0 holds 1's copy)
