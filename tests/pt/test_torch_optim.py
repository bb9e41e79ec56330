"""hvd_bert.pt optimizers against hvd_bert.core.optim on the same inputs."""

import io

import numpy as np
import pytest
import torch

from closeness import assert_close, seed_of
from hvd_bert.core import optim as O
from hvd_bert.config import OptimConfig
from hvd_bert.pt.kernels import optim as fused_optim
from hvd_bert.pt.kernels.build import CKernels
from hvd_bert.pt.optim import Lamb, Lars, NVLamb, build_optimizer, init_state, param_groups

SHAPES = [(3,), (), (1,), (4, 5), (2, 3, 4), (7,)]


def make_case(seed, dtype, zero_first=False):
    rng = np.random.default_rng(seed)
    ws = [rng.normal(size=s) for s in SHAPES]
    if zero_first:
        ws[0] = np.zeros(SHAPES[0])
    gs = [[rng.normal(size=s) * 0.1 for s in SHAPES] for _ in range(3)]
    params = [torch.nn.Parameter(torch.tensor(w, dtype=dtype)) for w in ws]
    return ws, gs, params


def run_torch(opt, params, grads_seq):
    for grads in grads_seq:
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g, dtype=p.dtype)
        opt.step()
    return [p.detach().double().numpy() for p in params]


def run_common(name, ws, grads_seq, **kw):
    state = O.init_state(name, ws)
    for grads in grads_seq:
        ws, state, _ = O.apply_step(name, ws, grads, state, **kw)
    return ws


# Worst case over 8 seeds (tests/bounds/MEASURED.md, Zen 4) as a share of the bound: float32
# LARS 0.021 (margin 47x), LAMB and NVLAMB 0.008 (127x); float64 below 6e-6 (1.8e5x).
TOL = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=2e-5, atol=2e-6)}


def groups_of(params, decay_mask, wd, adapt_fn):
    """One group per tensor, so masks can differ tensor by tensor."""
    return [{"params": [p], "weight_decay": wd if d else 0.0, "adapt": adapt_fn(d)}
            for p, d in zip(params, decay_mask)]


@pytest.fixture(params=["fused", "default", 7, 0],
                ids=["fused-kernels", "chunk-default", "chunk-7", "chunk-off"])
def chunking(request, monkeypatch):
    """Run the update through the fused CPU kernels (the default where a C compiler is
    present), or the foreach path over cache-sized slices (7 elements: tensors cut across
    slices and slices spanning tensors) or whole tensors (0)."""
    import hvd_bert.pt.optim_parts as optim_mod
    if request.param == "fused":
        monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "1")  # also under a user's HVD_BERT_FUSED_OPTIM=0
        assert fused_optim.usable([torch.zeros(1)]), "the fused CPU kernels did not build here"
        return request.param
    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "0")
    if request.param != "default":
        monkeypatch.setattr(optim_mod, "CHUNK_ELEMENTS", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("zero_first", [False, True])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_lamb_matches_common(dtype, zero_first, bias_correction, chunking):
    ws, gs, params = make_case(seed_of(1), dtype, zero_first)
    mask = [True, False, True, True, False, True]
    opt = Lamb(groups_of(params, mask, 0.01, lambda d: True), lr=0.01, weight_decay=0.01,
               bias_correction=bias_correction)
    got = run_torch(opt, params, gs)
    want = run_common("lamb", ws, gs, lr=0.01, weight_decay=0.01, decay_mask=mask,
                      bias_correction=bias_correction)
    for a, b in zip(got, want):
        assert_close(a, b, **TOL[dtype], site=f"pt/optim::test_lamb_matches_common/{dtype}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("use_nvlamb", [False, True])
@pytest.mark.parametrize("grad_scale", [1.0, 30.0])  # below and above the clip norm
def test_nvlamb_matches_common(dtype, use_nvlamb, grad_scale, chunking):
    ws, gs, params = make_case(seed_of(2), dtype)
    gs = [[g * grad_scale for g in step] for step in gs]
    mask = [True, False, True, False, True, True]
    opt = NVLamb([{"params": [p], "weight_decay": 0.01 if d else 0.0} for p, d in zip(params, mask)],
                 lr=0.01, use_nvlamb=use_nvlamb)
    got = run_torch(opt, params, gs)
    want = run_common("nvlamb", ws, gs, lr=0.01, decay_mask=mask, use_nvlamb=use_nvlamb)
    for a, b in zip(got, want):
        assert_close(a, b, **TOL[dtype], site=f"pt/optim::test_nvlamb_matches_common/{dtype}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("zero_first", [False, True])
def test_lars_matches_common(dtype, zero_first, chunking):
    ws, gs, params = make_case(seed_of(3), dtype, zero_first)
    mask = [True, False, True, True, False, True]
    opt = Lars([{"params": [p], "weight_decay": 5e-4 if a else 0.0, "adapt": a}
                for p, a in zip(params, mask)], lr=1.0, momentum=0.9, eta=1e-3)
    got = run_torch(opt, params, gs)
    want = run_common("lars", ws, gs, lr=1.0, momentum=0.9, weight_decay=5e-4, eta=1e-3,
                      adapt_mask=mask)
    for a, b in zip(got, want):
        assert_close(a, b, **TOL[dtype], site=f"pt/optim::test_lars_matches_common/{dtype}")


@pytest.mark.parametrize("name", ["sgd", "adamw", "lamb", "nvlamb", "lars", "lion"])
def test_build_optimizer_from_config_matches_common(name):
    torch.manual_seed(seed_of(0))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    names = [n.replace("1.", "1.LayerNorm.") if n.startswith("1.") else n
             for n, _ in model.named_parameters()]
    named = list(zip(names, model.parameters()))
    cfg = OptimConfig(name=name, lr=0.05, weight_decay=0.01, eps=1e-6)
    ws = [p.detach().double().numpy().copy() for _, p in named]
    rng = np.random.default_rng(seed_of(0))
    gs = [[rng.normal(size=w.shape) for w in ws] for _ in range(3)]
    opt = build_optimizer(named, cfg)
    for g in opt.param_groups:  # run in float64 to compare tightly
        for p in g["params"]:
            p.data = p.data.double()
    init_state(opt)
    got = run_torch(opt, [p for _, p in named], gs)
    want = run_common(name, ws, gs, lr=0.05, **cfg.step_kwargs(names))
    for a, b in zip(got, want):
        assert_close(a, b, rtol=1e-9, atol=1e-11,
                     site="pt/optim::test_build_optimizer_from_config_matches_common")


def test_reference_vectors_in_float32():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = Lamb([w], lr=0.01, weight_decay=0.01)
    run_torch(opt, [w], [[np.array([0.1, 0.2, -0.3])], [np.array([-0.05, 0.1, 0.2])]])
    assert_close(w.detach().numpy(), [0.9670593971, -2.057225312, 3.025718234], rtol=1e-6,
                 site="pt/optim::test_reference_vectors_in_float32")
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = Lars([w], lr=1.0, momentum=0.9, weight_decay=5e-4, eta=1e-3)
    run_torch(opt, [w], [[np.array([0.1, 0.2, -0.3])], [np.array([-0.05, 0.1, 0.2])]])
    assert_close(w.detach().numpy(), [0.9989024676, -2.005367092, 3.002376682], rtol=1e-6,
                 site="pt/optim::test_reference_vectors_in_float32")


@pytest.mark.parametrize("cls", [Lamb, NVLamb, Lars])
def test_state_dict_round_trip_continues_identically(cls):
    torch.manual_seed(seed_of(0))
    a = torch.nn.Linear(5, 3)
    b = torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = cls(a.parameters(), lr=0.01), cls(b.parameters(), lr=0.01)
    x = torch.randn(8, 5)
    for _ in range(2):
        opt_a.zero_grad()
        a(x).square().mean().backward()
        opt_a.step()
    buf = io.BytesIO()
    torch.save({"opt": opt_a.state_dict(), "model": a.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)
    opt_b.load_state_dict(saved["opt"])
    b.load_state_dict(saved["model"])
    for m, o in ((a, opt_a), (b, opt_b)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_init_state_takes_no_step():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = Lamb([w], lr=0.01, weight_decay=0.01)
    init_state(opt)
    st = opt.state[w]
    assert st["step"].item() == 0 and not st["exp_avg"].any()
    assert torch.equal(w, torch.tensor([1.0, -2.0, 3.0]))  # no weight decay applied
    # the first real step is then t = 1, as in the reference vector
    run_torch(opt, [w], [[np.array([0.1, 0.2, -0.3])]])
    assert_close(w.detach().numpy(), [0.9778900231, -2.021453348, 3.021234472], rtol=1e-6,
                 site="pt/optim::test_init_state_takes_no_step")


def test_init_state_for_torch_optimizers_and_refusal():
    w = torch.nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    init_state(sgd)
    assert torch.equal(sgd.state[w]["momentum_buffer"], torch.zeros(2))
    with pytest.raises(TypeError, match="cannot create the state of RMSprop"):
        init_state(torch.optim.RMSprop([w]))


def test_param_groups_follow_bert_names():
    model = torch.nn.Module()
    model.dense = torch.nn.Linear(2, 2)
    model.LayerNorm = torch.nn.LayerNorm(2)
    groups = param_groups(model.named_parameters(), OptimConfig(name="nvlamb", weight_decay=0.01))
    by_name = {n: (g["weight_decay"], g["adapt"]) for g in groups for n in g["names"]}
    assert by_name == {"dense.weight": (0.01, True), "dense.bias": (0.0, False),
                       "LayerNorm.weight": (0.0, False), "LayerNorm.bias": (0.0, False)}


def test_invalid_hyperparameters_are_rejected():
    w = [torch.nn.Parameter(torch.ones(1))]
    with pytest.raises(ValueError, match="invalid LAMB"):
        Lamb(w, lr=-1)
    with pytest.raises(ValueError, match="invalid LARS"):
        Lars(w, momentum=1.5)


@pytest.mark.parametrize("make", [
    lambda ps: Lamb(ps, lr=0.01, weight_decay=0.01, max_grad_norm=0.3, bias_correction=False),
    lambda ps: NVLamb(ps, lr=0.01, max_grad_norm=0.5, use_nvlamb=True),
    lambda ps: Lars(ps, lr=0.5, momentum=0.8, eta=0.01, weight_decay=1e-3),
])
def test_rebuilding_from_param_groups_keeps_every_setting(make):
    """hvd.DistributedOptimizer rebuilds the optimizer as type(opt)(opt.param_groups, ...)."""
    ws, gs, params_a = make_case(seed_of(5), torch.float64)
    params_b = [torch.nn.Parameter(p.detach().clone()) for p in params_a]
    a = make([{"params": params_a[:3], "weight_decay": 0.0}, {"params": params_a[3:]}])
    template = make([{"params": params_b[:3], "weight_decay": 0.0}, {"params": params_b[3:]}])
    b = type(template)(template.param_groups)
    gs = [[g * 50 for g in step] for step in gs]  # above the clip norms
    for x, y in zip(run_torch(a, params_a, gs), run_torch(b, params_b, gs)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["lamb", "nvlamb", "lars"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_kernels_on_large_tensors_match_common(name, dtype, monkeypatch):
    """Tensors big enough for the kernels' OpenMP loops (and lengths that are no multiple of
    the vector width), against the reference and against the foreach path."""
    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "1")
    rng = np.random.default_rng(seed_of(7))
    shapes = [(300_001,), (513, 257), (5,)]
    ws = [rng.normal(size=s) * 0.05 for s in shapes]
    gs = [[rng.normal(size=s) * (0.5 if name == "nvlamb" else 1e-3) for s in shapes] for _ in range(3)]
    mask = [True, True, False]
    kw = dict(lars=dict(lr=1.0, momentum=0.9, weight_decay=5e-4, eta=1e-3, adapt_mask=mask),
              lamb=dict(lr=0.01, weight_decay=0.01, decay_mask=mask),
              nvlamb=dict(lr=0.01, weight_decay=0.01, decay_mask=mask, max_grad_norm=1.0))[name]

    def make():
        params = [torch.nn.Parameter(torch.tensor(w, dtype=dtype)) for w in ws]
        if name == "lars":
            groups = [{"params": [p], "weight_decay": 5e-4 if a else 0.0, "adapt": a}
                      for p, a in zip(params, mask)]
            return params, Lars(groups, lr=1.0, momentum=0.9, eta=1e-3)
        groups = [{"params": [p], "weight_decay": 0.01 if d else 0.0} for p, d in zip(params, mask)]
        cls = NVLamb if name == "nvlamb" else Lamb
        return params, cls(groups, lr=0.01, weight_decay=0.01)

    calls = []
    for fn in ("lamb_step", "lars_step"):
        real = getattr(fused_optim, fn)
        monkeypatch.setattr(fused_optim, fn, lambda *a, _real=real, _fn=fn: calls.append(_fn) or _real(*a))
    params, opt = make()
    got = run_torch(opt, params, gs)
    assert calls, "the fused kernels were not used"
    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "0")
    params, opt = make()
    foreach = run_torch(opt, params, gs)
    want = run_common(name, ws, gs, **kw)
    tol = TOL[dtype] if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-6)
    for a, b, c in zip(got, foreach, want):
        assert_close(a, c, **tol,
                     site=f"pt/optim::test_fused_kernels_on_large_tensors_match_common/{dtype}")
        assert_close(a, b, **tol,
                     site=f"pt/optim::test_fused_kernels_on_large_tensors_match_common/{dtype}")


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", ["lamb", "nvlamb", "lars"])
def test_fused_group_of_many_tensors_matches_common_and_repeats_bit_for_bit(name, threads, monkeypatch):
    """One kernel call steps a whole group: tensors the team shares (>= SPLIT elements) and
    tensors one thread takes whole, in one group, against the reference; with a team of 3 (the
    order in which threads finish must not change the norms) two runs agree bit for bit."""
    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "1")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rng = np.random.default_rng(seed_of(11))
        shapes = [(70_000,), (5,), (300_001,), (3, 7), (65_536,), (65_535,), (1,)]
        mask = [True, True, True, False, True, False, True]  # decay / trust ratio per tensor
        ws = [rng.normal(size=s) * 0.05 for s in shapes]
        gs = [[rng.normal(size=s) * (0.5 if name == "nvlamb" else 1e-3) for s in shapes]
              for _ in range(3)]

        def run():
            params = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w in ws]
            on = [p for p, d in zip(params, mask) if d]
            off = [p for p, d in zip(params, mask) if not d]
            if name == "lars":
                opt = Lars([{"params": on, "weight_decay": 5e-4}, {"params": off, "adapt": False}],
                           lr=1.0, momentum=0.9, eta=1e-3)
            else:
                cls = NVLamb if name == "nvlamb" else Lamb
                opt = cls([{"params": on, "weight_decay": 0.01}, {"params": off, "weight_decay": 0.0}],
                          lr=0.01)
            return run_torch(opt, params, gs)

        got, again = run(), run()
    finally:
        torch.set_num_threads(old_threads)
    kw = dict(lars=dict(lr=1.0, momentum=0.9, weight_decay=5e-4, eta=1e-3, adapt_mask=mask),
              lamb=dict(lr=0.01, weight_decay=0.01, decay_mask=mask, bias_correction=True),
              nvlamb=dict(lr=0.01, weight_decay=0.01, decay_mask=mask, max_grad_norm=1.0))[name]
    want = run_common(name, ws, gs, **kw)
    for a, b, c in zip(got, again, want):
        assert_close(a, c, rtol=1e-4, atol=1e-6,
                     site="pt/optim::test_fused_group_of_many_tensors_matches_common_and_repeats_bit_for_bit")
        np.testing.assert_array_equal(a, b)


def test_fused_sum_of_squares_matches_float64_and_keeps_inf_and_nan():
    """The global-norm kernel (NVLamb's clip, the engine's grad norm): squares summed in double,
    so a large finite gradient keeps a finite norm; inf and nan come through."""
    rng = np.random.default_rng(seed_of(3))
    arrays = [rng.normal(size=s) for s in [(70_000,), (5,), (300_001,), (0,), (65_535,)]]
    for dtype in (torch.float32, torch.float64):
        ts = [torch.tensor(a, dtype=dtype) for a in arrays]
        want = sum(float((t.double() ** 2).sum()) for t in ts)
        assert fused_optim.sumsq(ts) == pytest.approx(want, rel=1e-12)
    big = torch.full((100_000,), 1e20)
    assert fused_optim.sumsq([big]) == pytest.approx(1e45, rel=1e-6)
    assert fused_optim.sumsq([torch.tensor([1.0, float("inf")])]) == float("inf")
    assert np.isnan(fused_optim.sumsq([torch.zeros(3), torch.tensor([float("nan")])]))


def test_fused_kernels_fall_back_with_one_warning_without_a_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "1")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("HVD_BERT_CACHE", str(tmp_path))
    k = fused_optim._KERNELS  # a fresh, unbuilt copy: the build is tried again with this CC
    monkeypatch.setattr(fused_optim, "_KERNELS", CKernels(k.name, k.source, k.declare, k.what, k.fallback))
    ws, gs, params = make_case(seed_of(4), torch.float32)
    opt = Lamb(params, lr=0.01, weight_decay=0.01)
    with pytest.warns(UserWarning, match="fused CPU optimizer kernels could not be built"):
        got = run_torch(opt, params, gs)
    assert not fused_optim.usable(params)
    assert not list(tmp_path.rglob("*.so")), "a failed build left a file behind"
    want = run_common("lamb", ws, gs, lr=0.01, weight_decay=0.01, decay_mask=[True] * len(ws))
    for a, b in zip(got, want):
        assert_close(a, b, **TOL[torch.float32],
                     site="pt/optim::test_fused_kernels_fall_back_with_one_warning_without_a_compiler")


@pytest.mark.parametrize("name", ["lamb", "nvlamb", "lars", "lion", "sgd", "adamw"])
def test_a_gated_update_applies_at_1_and_leaves_every_tensor_as_it_was_at_0(name, monkeypatch):
    """The rule of a step decided on the device (``optim_parts.coef``): gate 1 is the plain
    update (within float rounding: tensor coefficients instead of numbers), gate 0 with inf and
    NaN in the gradients changes no weight and no state, bit for bit. The gate-1 bound over 8 seed
    shifts (tests/bounds/measure.py, AMD EPYC): worst 0.067 of it (SGD; 15x margin), LAMB 0.0023."""
    from hvd_bert.pt.optim_parts import local_norms, piece_rule, whole_parts

    monkeypatch.setenv("HVD_BERT_FUSED_OPTIM", "0")
    cfg = OptimConfig(name=name, weight_decay=0.01, momentum=0.9, nesterov=name == "sgd")

    def stepped(gate, grads):
        torch.manual_seed(seed_of(31))
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
        opt = build_optimizer(model.named_parameters(), cfg, lr=0.01)
        init_state(opt)
        rule = piece_rule(opt)
        for i, g in enumerate(grads):  # two steps: the state is not zero when the gate is tried
            for p, gp in zip(model.parameters(), g):
                p.grad = gp.clone()
            parts = whole_parts(opt, rule.buffers, [i + 1] * len(opt.param_groups))
            rule.update(parts, local_norms(opt), torch.tensor(0.5), gate if i == 1 else None)
        state = [t.clone() for st in opt.state.values() for k, t in st.items() if k in rule.buffers]
        return [p.detach().clone() for p in model.parameters()], state

    torch.manual_seed(seed_of(32))
    shapes = [p.shape for p in torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4),
                                                      torch.nn.Linear(4, 2)).parameters()]
    g1, g2 = ([torch.randn(s) for s in shapes] for _ in range(2))
    plain = stepped(None, [g1, g2])
    applied = stepped(torch.tensor(1.0), [g1, g2])
    for a, b in zip(plain[0] + plain[1], applied[0] + applied[1]):
        assert_close(b, a, rtol=1e-6, atol=1e-7, site=f"pt/optim::gate_1/{name}")
    bad = [g.clone() for g in g2]
    bad[0][0, 0], bad[1][0] = float("inf"), float("nan")
    once = stepped(None, [g1])
    skipped = stepped(torch.tensor(0.0), [g1, bad])
    assert all(torch.equal(a, b) for a, b in zip(once[0] + once[1], skipped[0] + skipped[1]))
