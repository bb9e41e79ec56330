"""TensorFlow engine, fit path and kernels in one process (Horovod size 1)."""

import numpy as np
import pytest

from closeness import assert_close, seed_of
import hvd_bert.tf  # noqa: F401
import tensorflow as tf

from hvd_bert.core.schedules import Constant
from hvd_bert.tf import kernels as K
from hvd_bert.tf.callbacks import distributed_optimizer, fit_callbacks
from hvd_bert.tf.engine import Engine, set_precision_policy
from hvd_bert.tf.optim import Lamb

keras = tf.keras


@pytest.fixture(autouse=True)
def fp32_policy():
    yield
    set_precision_policy("fp32")


def model_and_data():
    keras.utils.set_random_seed(seed_of(0))
    model = keras.Sequential([keras.layers.Dense(8, activation="tanh", input_shape=(4,)),
                              keras.layers.Dense(1, dtype="float32")])
    rng = np.random.default_rng(seed_of(0))
    return model, rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")


def mse(model, batch):
    x, y = batch
    return tf.reduce_mean(tf.square(tf.cast(model(x), tf.float32) - y))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_fused_bias_gelu_equals_unfused(approximate):
    x = tf.random.normal((64, 48), seed=1)
    b = tf.random.normal((48,), seed=2)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, b])
        fused = K.bias_gelu(x, b, approximate)
        ref = tf.nn.gelu(x + b, approximate=approximate == "tanh")
    # XLA's fused kernel against TensorFlow's own; worst case over 8 seeds (tests/bounds/MEASURED.md,
    # Zen 4) as a share of each bound: y 0.20 (margin 4.9x), gx 0.094 (10.6x), gb 0.065 (15x)
    assert_close(fused.numpy(), ref.numpy(), rtol=4e-5, atol=4e-6,
                 site="tf/keras_engine::test_fused_bias_gelu_equals_unfused/y")
    for q, a, r in zip(("gx", "gb"), tape.gradient(fused, [x, b]), tape.gradient(ref, [x, b])):
        assert_close(a.numpy(), r.numpy(), rtol=1e-4, atol=5e-5,
                     site=f"tf/keras_engine::test_fused_bias_gelu_equals_unfused/{q}")


def test_dense_gelu_matches_dense_then_gelu():
    layer = K.DenseGELU(6, approximate="none")
    x = tf.random.normal((3, 5), seed=3)
    y = layer(x)
    ref = tf.nn.gelu(tf.matmul(x, layer.kernel) + layer.bias, approximate=False)
    # worst case 0.078 of the bound, margin 13x (tests/bounds/MEASURED.md, 8 seeds, Zen 4)
    assert_close(y.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6,
                 site="tf/keras_engine::test_dense_gelu_matches_dense_then_gelu")
    assert sorted(v.name.split("/")[-1] for v in layer.weights) == ["bias:0", "kernel:0"]


@pytest.mark.parametrize("jit", [False, True])
def test_engine_trains_with_and_without_xla(jit):
    model, x, y = model_and_data()
    engine = Engine(model, Lamb(0.05), mse, schedule=Constant(0.05), backward_passes_per_step=2,
                    jit_compile=jit)
    from hvd_bert.train.engine import Engine as Declared
    assert isinstance(engine, Declared)  # (every member train/ uses is there)
    losses = []
    for i in range(40):
        res = engine.train_micro_batch((x[i % 4 * 8:][:8], y[i % 4 * 8:][:8]))
        losses.append(float(engine.last_metrics["loss"]))
    assert engine.step_count == 20 and res is not None
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    # traced without AutoGraph (half of a rank's start-up; BENCHMARKS.md, "Start-up of one rank")
    assert engine._micro._autograph is False and engine._apply._autograph is False


def test_engine_bf16_policy_runs_and_keeps_fp32_variables():
    set_precision_policy("bf16")
    model, x, y = model_and_data()
    engine = Engine(model, Lamb(0.05), mse, schedule=Constant(0.05), precision="bf16")
    assert model.layers[0].compute_dtype == "bfloat16"
    assert all(v.dtype == tf.float32 for v in model.trainable_variables)
    res = engine.train_micro_batch((x, y))
    assert res is not None and not res.skipped and res.loss_scale == 1.0


def test_step_arguments_are_checked():
    model, _, _ = model_and_data()
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        Engine(model, Lamb(), mse, schedule=Constant(0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="compression"):
        Engine(model, Lamb(), mse, schedule=Constant(0.1), compression="int8")


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "ckpt-00000002.tf").mkdir()
    (tmp_path / "ckpt-00000002.tf" / "meta.json").write_text('{"format": 1, "world_size": 1, "step": 2}')
    model, _, _ = model_and_data()
    engine = Engine(model, Lamb(), mse, schedule=Constant(0.1))
    with pytest.raises(RuntimeError, match=r"ckpt-00000002.tf is damaged: its metadata has micro_step=None"):
        engine.resume(tmp_path)  # (its metadata is checked before its tensors are read)


def test_fit_under_loss_scale_and_distributed_optimizer():
    hvd_bert.tf.init_horovod()  # the fit callbacks broadcast: a script calls hvd.init() first (not Engine)
    set_precision_policy("fp16")
    model, x, y = model_and_data()
    model.compile(optimizer=distributed_optimizer(Lamb(0.05), loss_scale=True), loss="mse")
    hist = model.fit(x, y, batch_size=8, epochs=3, verbose=0,
                     callbacks=fit_callbacks(Constant(0.05), 1, 8, log_every=100))
    losses = hist.history["loss"]
    assert losses[-1] < losses[0]
    inner = model.optimizer.inner_optimizer
    assert int(inner.applied_steps.numpy()) == 12


def test_fit_accumulation_with_fp16_loss_scaling_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="ranks disagree on the loss scale.*Engine"):
        distributed_optimizer(Lamb(), backward_passes_per_step=2, loss_scale=True)


def test_fit_accumulation_counts_optimizer_steps_not_micro_batches():
    hvd_bert.tf.init_horovod()  # the fit callbacks broadcast: a script calls hvd.init() first (not Engine)
    model, x, y = model_and_data()
    model.compile(optimizer=distributed_optimizer(Lamb(0.05), backward_passes_per_step=2), loss="mse")
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=fit_callbacks(Constant(0.05), 2, 16))
    assert int(model.optimizer.applied_steps.numpy()) == 6
    assert int(model.optimizer.iterations.numpy()) == 12  # Horovod counts micro-batches here
