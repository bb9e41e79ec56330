"""Schedules and batch scaling against REFERENCE.md section 2, with every boundary."""

import math

import pytest

from hvd_bert.core import schedules as S


@pytest.mark.parametrize("step,lr", [
    (1, 2.998645512e-6), (1000, 0.002998645512), (2000, 0.005997291024),
    (2001, 0.005075894589), (3519, 0.004242640687), (7038, 0.0),
])
def test_bert_poly_warmup_vectors(step, lr):
    f = S.PolyWarmupDecay(6e-3, 0.2843, 7038, power=0.5)
    assert f(step) == pytest.approx(lr, rel=1e-9, abs=1e-15)


def test_bert_poly_warmup_edges():
    f = S.PolyWarmupDecay(6e-3, 0.2843, 7038)
    assert f(0) == 0.0
    assert f(7039) == 0.0  # past the horizon: 0, not NaN
    g = S.PolyWarmupDecay(1.0, 0.0, 10, power=1.0)  # Google BERT's linear decay, no warmup
    assert [g(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.5, 0.0])


def test_linear_warmup_boundaries():
    f = S.LinearWarmup(peak=1.0, warmup_steps=4)
    assert [f(s) for s in range(6)] == pytest.approx([0, 0.25, 0.5, 0.75, 1.0, 1.0])
    assert S.LinearWarmup(2.0, 0)(0) == 2.0


def test_goyal_warmup_from_base_to_scaled():
    f = S.goyal_warmup(0.1, 256, 8192, warmup_steps=10)
    assert f(0) == pytest.approx(0.1)
    assert f(10) == pytest.approx(3.2)
    assert f(5) == pytest.approx(0.1 + (3.2 - 0.1) / 2)


def test_step_decay_boundaries():
    f = S.StepDecay(1.0, (3, 6), 0.1)
    assert [f(s) for s in (0, 2, 3, 5, 6, 100)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


def test_polynomial_decay_power_two():
    f = S.PolynomialDecay(init=10.0, decay_steps=4, end=1e-4, power=2)
    assert f(0) == pytest.approx(10.0)
    assert f(2) == pytest.approx((10 - 1e-4) * 0.25 + 1e-4)
    assert f(4) == pytest.approx(1e-4)
    assert f(99) == pytest.approx(1e-4)


def test_lars_schedule_is_warmup_then_decay_and_continuous():
    f = S.warmup_poly_decay(peak=10.0, warmup_steps=5, total_steps=15, end=1e-4, power=2)
    assert f(0) == 0.0
    assert f(5) == pytest.approx(10.0)
    assert f(4) < f(5) and f(6) < f(5)
    assert f(15) == pytest.approx(1e-4)


def test_join_schedules_restarts_count():
    f = S.join_schedules([S.Constant(1.0), S.LinearWarmup(2.0, 2), S.Constant(3.0)], [2, 4])
    assert [f(s) for s in range(6)] == pytest.approx([1, 1, 0, 1, 3, 3])


def test_join_schedules_validates():
    with pytest.raises(ValueError, match="one more schedule"):
        S.join_schedules([S.Constant(1.0)], [3])
    with pytest.raises(ValueError, match="increasing"):
        S.join_schedules([S.Constant(1.0)] * 3, [5, 2])


def test_negative_step_is_an_error():
    with pytest.raises(ValueError, match=">= 0"):
        S.Constant(1.0)(-1)


def test_linear_scaling_rule():
    assert S.linear_scaled_lr(0.1, 256, 8192) == pytest.approx(3.2)


@pytest.mark.parametrize("batch,lr,ratio", [
    (512, 6.25e-4, 512 / 32768 / 5), (4096, 1.768e-3, 4096 / 32768 / 5), (32768, 5e-3, 0.2)])
def test_lamb_paper_sqrt_rule(batch, lr, ratio):
    assert S.lamb_paper_lr(batch) == pytest.approx(lr, rel=1e-3)
    assert S.lamb_paper_warmup_ratio(batch) == pytest.approx(ratio)


def test_sqrt_scaling():
    assert S.sqrt_scaled_lr(1.0, 100, 400) == pytest.approx(2.0)
    assert S.sqrt_scaled_lr(1.0, 100, 100) == 1.0


def test_schedules_are_picklable_values():
    import pickle
    f = S.warmup_poly_decay(1.0, 2, 10)
    g = pickle.loads(pickle.dumps(f))
    assert g == f and all(math.isclose(f(s), g(s)) for s in range(12))
