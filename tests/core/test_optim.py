"""hvd_bert.core.optim against the vectors of REFERENCE.md section 1 (float64)."""

import numpy as np
import pytest

from hvd_bert.core import optim as O

W0 = np.array([1.0, -2.0, 3.0])
G1 = np.array([0.1, 0.2, -0.3])
G2 = np.array([-0.05, 0.1, 0.2])
RTOL = 1e-9


def close(a, b, rtol=RTOL):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=1e-12)


def test_lamb_two_steps_match_reference():
    s = O.adam_init([W0])
    (w1,), s, info = O.lamb_step([W0], [G1], s, lr=0.01, weight_decay=0.01)
    close(info.trust_ratios[0], 2.189128303)
    close(w1, [0.9778900231, -2.021453348, 3.021234472])
    close(s.m[0], [0.01, 0.02, -0.03])
    close(s.v[0], [1e-5, 4e-5, 9e-5])
    assert s.step == 1
    (w2,), s, info = O.lamb_step([w1], [G2], s, lr=0.01, weight_decay=0.01)
    close(info.trust_ratios[0], 3.922539976)
    close(w2, [0.9670593971, -2.057225312, 3.025718234])
    assert s.step == 2


def test_lamb_zero_weight_norm_gives_ratio_one():
    z = np.zeros(3)
    (w1,), _, info = O.lamb_step([z], [G1], O.adam_init([z]), lr=0.01, weight_decay=0.0)
    assert info.trust_ratios == (1.0,)
    close(w1, [-0.009999900001, -0.00999995, 0.009999966667])


def test_lamb_zero_update_norm_gives_ratio_one_and_no_change():
    z = np.zeros(3)
    (w1,), _, info = O.lamb_step([W0], [z], O.adam_init([W0]), lr=0.01, weight_decay=0.0)
    assert info.trust_ratios == (1.0,)
    close(w1, W0)


def test_lamb_without_bias_correction_differs_on_first_step():
    s = O.adam_init([W0])
    (a,), _, _ = O.lamb_step([W0], [G1], s, lr=0.01, weight_decay=0.01)
    (b,), _, _ = O.lamb_step([W0], [G1], s, lr=0.01, weight_decay=0.01, bias_correction=False)
    assert not np.allclose(a, b)


NV_W0 = [np.array([1.0, -2.0, 3.0]), np.array([0.5, -0.5])]
NV_G = [[np.array([0.5, -1.0, 1.5]), np.array([0.2, -0.4])],
        [np.array([0.1, 0.05, -0.2]), np.array([0.01, 0.02])]]


@pytest.mark.parametrize("use_nvlamb,b1,b2", [
    (False, [0.4900000962, -0.4900000481], [0.4826176672, -0.4840430671]),
    (True, [0.495000012, -0.494999988], [0.4895520723, -0.4906039724]),
])
def test_nvlamb_two_steps_match_reference(use_nvlamb, b1, b2):
    s = O.adam_init(NV_W0)
    p, s, info = O.nvlamb_step(NV_W0, NV_G[0], s, lr=0.01, decay_mask=[True, False],
                               use_nvlamb=use_nvlamb)
    close(info.grad_norm, 1.923538406)
    close(p[0], [0.9786100376, -1.978398214, 2.978186418], rtol=1e-8)
    close(p[1], b1, rtol=1e-8)
    p, s, info = O.nvlamb_step(p, NV_G[1], s, lr=0.01, decay_mask=[True, False],
                               use_nvlamb=use_nvlamb)
    close(info.grad_norm, 0.2302172887)
    close(p[0], [0.9507049996, -1.959365918, 2.962915083], rtol=1e-8)
    close(p[1], b2, rtol=1e-8)


def test_nvlamb_does_not_clip_below_max_norm():
    g = [x * 0.01 for x in NV_G[0]]
    s = O.adam_init(NV_W0)
    a, _, _ = O.nvlamb_step(NV_W0, g, s, lr=0.01, decay_mask=[True, False])
    b, _, _ = O.lamb_step(NV_W0, g, s, lr=0.01, weight_decay=0.01, decay_mask=[True, False],
                          adapt_mask=[True, False])
    for x, y in zip(a, b):
        close(x, y)


def test_lars_two_steps_with_excluded_tensor_match_reference():
    params = [W0, np.array([0.5, -0.5])]
    s = O.momentum_init(params)
    p, s, info = O.lars_step(params, [G1, np.array([0.2, -0.4])], s, lr=1.0, momentum=0.9,
                             weight_decay=5e-4, eta=1e-3, adapt_mask=[True, False])
    close(info.trust_ratios[0], 0.009950248756)
    close(p[0], [0.999, -2.0019801, 3.002970149], rtol=1e-8)
    close(p[1], [0.3, -0.1])
    p, s, info = O.lars_step(p, [G2, np.array([0.1, 0.1])], s, lr=1.0, momentum=0.9,
                             weight_decay=5e-4, eta=1e-3, adapt_mask=[True, False])
    close(info.trust_ratios[0], 0.01621130298)
    close(p[0], [0.9989024676, -2.005367092, 3.002376682], rtol=1e-8)
    close(p[1], [0.02, 0.16])


@pytest.mark.parametrize("w,g", [(np.zeros(3), G1), (W0, np.zeros(3))])
def test_lars_zero_norm_gives_trust_one(w, g):
    _, _, info = O.lars_step([w], [g], O.momentum_init([w]), lr=1.0, weight_decay=5e-4)
    assert info.trust_ratios == (1.0,)


def test_sgd_momentum_matches_hand_computation():
    s = O.momentum_init([W0])
    (w1,), s, _ = O.sgd_step([W0], [G1], s, lr=0.1, momentum=0.9, weight_decay=0.01)
    d1 = G1 + 0.01 * W0
    close(w1, W0 - 0.1 * d1)
    (w2,), s, _ = O.sgd_step([w1], [G2], s, lr=0.1, momentum=0.9, weight_decay=0.01)
    close(w2, w1 - 0.1 * (0.9 * d1 + G2 + 0.01 * w1))


def test_sgd_nesterov_matches_hand_computation():
    s = O.momentum_init([W0])
    (w1,), _, _ = O.sgd_step([W0], [G1], s, lr=0.1, momentum=0.9, nesterov=True)
    close(w1, W0 - 0.1 * (G1 + 0.9 * G1))


def test_lion_two_steps_match_the_papers_algorithm():
    """Chen et al. 2023, Algorithm 2, line by line: c = b1 m + (1 - b1) g; w -= lr (sign(c) + wd w);
    m = b2 m + (1 - b2) g (the decay only where the mask says)."""
    b1, b2, lr, wd = 0.9, 0.99, 0.01, 0.1
    params = [W0, W0.copy()]
    s = O.momentum_init(params)
    p, s, _ = O.lion_step(params, [G1, G1], s, lr=lr, beta1=b1, beta2=b2, weight_decay=wd,
                          decay_mask=[True, False])
    m = np.zeros_like(W0)
    want = W0 - lr * (np.sign(b1 * m + (1 - b1) * G1) + wd * W0)
    close(p[0], want)
    close(p[1], W0 - lr * np.sign(G1))
    m = b2 * m + (1 - b2) * G1
    (w2, _), s, _ = O.lion_step(p, [G2, G2], s, lr=lr, beta1=b1, beta2=b2, weight_decay=wd,
                                decay_mask=[True, False])
    close(w2, want - lr * (np.sign(b1 * m + (1 - b1) * G2) + wd * want))
    close(s.v[0], b2 * m + (1 - b2) * G2)
    assert s.step == 2


def test_adamw_first_step_is_sign_step_plus_decay():
    (w1,), _, _ = O.adamw_step([W0], [G1], O.adam_init([W0]), lr=0.01, weight_decay=0.1, eps=0.0)
    close(w1, W0 - 0.01 * (np.sign(G1) + 0.1 * W0))


def test_decay_mask_turns_weight_decay_off():
    params = [W0, W0.copy()]
    p, _, _ = O.adamw_step(params, [G1, G1], O.adam_init(params), lr=0.01, weight_decay=0.1,
                           decay_mask=[True, False])
    assert not np.allclose(p[0], p[1])
    (nodecay,), _, _ = O.adamw_step([W0], [G1], O.adam_init([W0]), lr=0.01, weight_decay=0.0)
    close(p[1], nodecay)


def test_name_mask_uses_bert_patterns():
    names = ["encoder.layer.0.attention.self.query.weight", "encoder.layer.0.attention.self.query.bias",
             "encoder.layer.0.output.LayerNorm.weight", "bert/encoder/layer_norm/gamma", "cls.dense.kernel"]
    assert O.name_mask(names, O.BERT_EXCLUDE) == [True, False, False, False, True]


def test_global_norm_and_clip():
    grads = [np.array([3.0]), np.array([4.0])]
    assert O.global_norm(grads) == 5.0
    clipped, n = O.clip_by_global_norm(grads, 1.0)
    assert n == 5.0
    close(O.global_norm(clipped), 1.0)
    same, _ = O.clip_by_global_norm(grads, 10.0)
    close(same[0], grads[0])


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="same number of tensors"):
        O.lamb_step([W0, W0], [G1], O.adam_init([W0, W0]), lr=0.1)
    with pytest.raises(ValueError, match="one entry per tensor"):
        O.lamb_step([W0], [G1], O.adam_init([W0]), lr=0.1, decay_mask=[True, False])


def test_unknown_optimizer_names_choices():
    with pytest.raises(ValueError, match="choose one of"):
        O.init_state("adagrad", [W0])


@pytest.mark.parametrize("name", sorted(O.OPTIMIZERS))
def test_every_optimizer_keeps_shapes_and_advances_step(name):
    params = [np.ones((2, 3)), np.ones(()), np.ones(1)]
    grads = [np.full((2, 3), 0.1), np.array(0.2), np.array([-0.3])]
    state = O.init_state(name, params)
    new, state, _ = O.apply_step(name, params, grads, state, lr=0.01)
    assert [x.shape for x in new] == [x.shape for x in params]
    assert state.step == 1
    assert all(not np.array_equal(a, b) for a, b in zip(new, params))


def test_transforms_compose_in_order_with_their_own_state():
    w = [np.array([1.0, -2.0]), np.array([[0.5]])]
    g = [np.array([0.1, 0.2]), np.array([[-0.3]])]
    tx = O.chain(O.add_decayed_weights(0.1, [True, False]), O.trace(0.9), O.scale(-0.5))
    state = tx.init(w)
    assert state[0] is None and state[2] is None and state[1].step == 0
    updates, state = tx.update(g, state, w)
    d0 = g[0] + 0.1 * w[0]  # decayed where the mask says, then momentum from zero, then -lr
    np.testing.assert_array_equal(updates[0], -0.5 * d0)
    np.testing.assert_array_equal(updates[1], -0.5 * g[1])
    updates, state = tx.update(g, state, w)  # the trace carries: v = 0.9 v + d
    np.testing.assert_allclose(updates[0], -0.5 * (0.9 * d0 + d0))
    assert state[1].step == 2
    new = O.apply_updates(w, updates)
    np.testing.assert_allclose(new[0], w[0] - 0.5 * 1.9 * d0)


def test_lamb_is_its_chain():
    rng = np.random.default_rng(0)
    w = [rng.normal(size=(3, 4)), rng.normal(size=4)]
    g = [rng.normal(size=(3, 4)), rng.normal(size=4)]
    new, state, info = O.lamb_step(w, g, O.adam_init(w), lr=0.01, weight_decay=0.1, adapt_mask=[True, False])
    tx = O.chain(O.scale_by_adam(), O.add_decayed_weights(0.1, [True, True]),
                 O.scale_by_trust_ratio([True, False]), O.scale(-0.01))
    updates, (adam, _, trust, _) = tx.update(g, tx.init(w), w)
    for a, b in zip(new, O.apply_updates(w, updates)):
        np.testing.assert_array_equal(a, b)
    assert trust.ratios == info.trust_ratios and trust.ratios[1] == 1.0 and adam.step == state.step == 1
