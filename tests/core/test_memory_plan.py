"""The memory plan of one job (hvd_bert/core/model_size.py ``rank_memory``, ``memory_plan_line``):
16 bytes a parameter replicated with LAMB in fp32, the optimizer state over N at ZeRO stage 1, the
gradients too at stage 2, the split parameters over T."""

import pytest

from hvd_bert.core.model_size import memory_plan_line, rank_memory

GIB = 2 ** 30


@pytest.mark.parametrize("stage,tp,dp,want", [
    (0, 1, 4, (4, 4, 8)), (1, 1, 4, (4, 4, 2)), (2, 1, 4, (4, 1, 2)), (2, 2, 2, (2, 1, 2))])
def test_one_rank_holds_its_share(stage, tp, dp, want):
    m = rank_memory(GIB, 0, buffers=2, zero_stage=stage, tensor_parallel=tp, data_parallel=dp)
    assert (m.weights / GIB, m.gradients / GIB, m.optimizer_state / GIB) == want


@pytest.mark.parametrize("stage,dp,want", [
    (0, 4, (2, 2, 12)), (1, 4, (2, 2, 3)), (2, 4, (2, 1, 3))])
def test_bf16_weights_hold_2_bytes_and_the_fp32_masters_go_with_the_state(stage, dp, want):
    """DeepSpeed's mixed-precision ZeRO: 2 + 2 bytes a parameter plus (4 masters + 8 LAMB) / N;
    at stage 2 the gradient shard is fp32 (4 / N)."""
    m = rank_memory(GIB, 0, buffers=2, zero_stage=stage, tensor_parallel=1, data_parallel=dp, masters=True)
    assert (m.weights / GIB, m.gradients / GIB, m.optimizer_state / GIB) == want


def test_parameters_held_whole_are_not_split():
    m = rank_memory(100, 50, buffers=1, zero_stage=0, tensor_parallel=2, data_parallel=1)
    assert m.weights == (50 + 50) * 4


def test_the_line_says_whether_the_ranks_on_a_host_fit():
    m = rank_memory(GIB, 0, buffers=2, zero_stage=0, tensor_parallel=1, data_parallel=4)  # 16 GiB
    line, fits = memory_plan_line(m, 4, 24 * GIB, "host a")
    assert not fits and "4 ranks on host a need 64.00 GiB of its 24.00 GiB available" in line
    assert memory_plan_line(m, 1, 24 * GIB, "GPU 0")[1]


def test_the_phase_that_raised_the_peak_is_named():
    from hvd_bert.train.memory import MemoryPhases

    peaks = iter([1, 2, 2, 5, 5, 5])
    phases = MemoryPhases(lambda: next(peaks) * GIB)
    for phase in ("build", "resume", "steps", "save", "steps", "save"):
        phases.mark(phase)
    line = phases.line()
    assert line.startswith("peak memory of rank 0: 5.00 GiB, reached by saving"), line
    assert "build 1.00, resume 2.00, steps 2.00, save 5.00" in line


@pytest.mark.parametrize("n, text", [(0, "0 B"), (512, "512 B"), (3 * 2**10, "3 KiB"),
                                     (1.5 * 2**20, "1.5 MiB"), (5 * 2**30, "5.00 GiB")])
def test_sizes_read_in_the_unit_that_shows_them(n, text):
    from hvd_bert.core.text import size_text

    assert size_text(n) == text
