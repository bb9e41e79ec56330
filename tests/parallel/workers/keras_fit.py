"""One rank of the Keras model.fit tests (see tests/parallel/test_keras_fit.py).

    python keras_fit.py MODE OPTIM K STEPS [overrides...] OUT_DIR
    python keras_fit.py MODE OPTIM:K[,OPTIM:K...] STEPS [overrides...] OUT_DIR

MODE: reference (one process, no Horovod, one global batch per step), fit (model.fit with the
toolkit's optimizer wrapper and callbacks), fit-resume (checkpoints in HVD_BERT_TEST_CKPT; with
HVD_BERT_TEST_STOP_AT=n the run stops after n steps). The custom-loop engine's worker is
engine_contract.py.

With several ``OPTIM:K`` pairs one process runs them all, one fresh model and optimizer each
(one launch instead of one per pair), and writes ``{"rank": r, "runs": {"OPTIM:K": {...}}}``.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import toy_data as D  # noqa: E402

import hvd_bert.tf  # noqa: E402,F401
import tensorflow as tf  # noqa: E402

from hvd_bert.config import TrainConfig, apply_overrides  # noqa: E402
from hvd_bert.core.schedules import make_schedule  # noqa: E402

keras = tf.keras
LOCAL_B = 4


def make_model():
    keras.utils.set_random_seed(D.SHIFT)
    model = keras.Sequential([
        keras.layers.Dense(D.HID, activation="tanh", input_shape=(D.IN,), name="dense_in"),
        keras.layers.LayerNormalization(name="layer_norm"),
        keras.layers.Dense(D.OUT, name="dense_out")])
    return model


def mse(model, batch):
    x, y = batch
    return tf.reduce_mean(tf.square(tf.cast(model(x, training=True), tf.float32) - y))


def flat(model):
    return np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64).tolist()


def reference(cfg, steps, world, k):
    from hvd_bert.tf.optim import build_optimizer
    g = world * LOCAL_B * k
    model = make_model()
    peak = cfg.optim.peak_lr(g)
    opt = build_optimizer(cfg.optim, lr=peak)
    sched = make_schedule(cfg.schedule, peak)
    x, y = D.dataset()
    for s in range(steps):
        rows = D.global_rows(s, g)
        with tf.GradientTape() as tape:
            loss = mse(model, (x[rows], y[rows]))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.learning_rate.assign(sched(s + 1))
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return {"rank": 0, "params": flat(model)}


def run(mode, optim, k, steps, extra):
    cfg = apply_overrides(TrainConfig(), D.overrides(optim, LOCAL_B, k, steps, *extra))
    if mode == "reference":
        return reference(cfg, steps, int(os.environ.get("HVD_BERT_TEST_WORLD", "2")), k)
    import horovod.tensorflow as hvd
    hvd.init()  # once; a second call in the same process does nothing
    r, n = hvd.rank(), hvd.size()
    x, y = D.dataset()
    result = {"rank": r, "size": n}
    ckpt = os.environ.get("HVD_BERT_TEST_CKPT")
    stop_at = int(os.environ.get("HVD_BERT_TEST_STOP_AT", "0")) or steps
    if mode.startswith("fit"):
        from hvd_bert.tf.callbacks import distributed_optimizer, fit_callbacks, restore_for_fit
        from hvd_bert.tf.optim import build_optimizer
        plan = cfg.batch.plan(n)
        peak = cfg.optim.peak_lr(plan.global_batch_size)
        model = make_model()
        model.compile(optimizer=distributed_optimizer(build_optimizer(cfg.optim, peak), k,
                                                      cfg.horovod.compression),
                      loss="mse", run_eagerly=False)
        start = restore_for_fit(model, ckpt) if mode == "fit-resume" else 0
        micro_total = stop_at * k
        rows = np.concatenate([D.rank_rows(r, n, LOCAL_B, k, m) for m in range(start, micro_total)])
        cbs = fit_callbacks(make_schedule(cfg.schedule, peak), k, plan.global_batch_size,
                            output_dir=ckpt if mode == "fit-resume" else None, log_every=1,
                            initial_micro_step=start)
        model.fit(x[rows], y[rows], batch_size=LOCAL_B, epochs=1, shuffle=False, verbose=0,
                  callbacks=cbs)
        result.update(params=flat(model), start_micro=start,
                      applied=int(model.optimizer.applied_steps.numpy())
                      if hasattr(model.optimizer, "applied_steps") else None)
    return result


def main():
    mode, optim, *rest = sys.argv[1:]
    if ":" in optim:
        steps, *extra, out = rest
        runs = {pair: run(mode, pair.split(":")[0], int(pair.split(":")[1]), int(steps), extra)
                for pair in optim.split(",")}
        result = {"rank": next(iter(runs.values()))["rank"], "runs": runs}
    else:
        k, steps, *extra, out = rest
        result = run(mode, optim, int(k), int(steps), extra)
    with open(os.path.join(out, f"rank{result['rank']}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
