"""The small regression model of the engine contract tests in each framework, behind one
interface (``adapter(framework)``): model, loss, batches, flat parameters, a rank's own
gradient before the allreduce, and the plain single-process reference on the global batch."""

import numpy as np

import toy_data as D


class Torch:
    def __init__(self):
        import torch
        self.torch = torch

    def make_model(self, dropout: float = 0.0, seed: int = 0):
        from collections import OrderedDict
        nn = self.torch.nn
        self.torch.manual_seed(seed + D.SHIFT)
        return nn.Sequential(OrderedDict(
            dense_in=nn.Linear(D.IN, D.HID), act=nn.Tanh(), LayerNorm=nn.LayerNorm(D.HID),
            drop=nn.Dropout(dropout), dense_out=nn.Linear(D.HID, D.OUT)))

    def loss(self, model, batch):
        x, y = batch
        return self.torch.nn.functional.mse_loss(model(x).float(), y)

    def batch(self, x, y):
        return self.torch.from_numpy(x), self.torch.from_numpy(y)

    def flat(self, model):
        return self.torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().tolist()

    def local_grad(self, engine):
        grad = engine.model.dense_in.weight.grad  # (None under ZeRO stage 2: reduced and freed)
        return None if grad is None else grad.reshape(-1)[:8].tolist()

    def reference(self, cfg, world, local_b, k, steps):
        from hvd_bert.core.schedules import make_schedule
        from hvd_bert.pt.optim import build_optimizer
        g = world * local_b * k
        model = self.make_model()
        peak = cfg.optim.peak_lr(g)
        opt = build_optimizer(model.named_parameters(), cfg.optim, lr=peak)
        sched = make_schedule(cfg.schedule, peak)
        x, y = D.dataset()
        for s in range(steps):
            rows = D.global_rows(s, g)
            opt.zero_grad()
            self.loss(model, self.batch(x[rows], y[rows])).backward()
            for group in opt.param_groups:
                group["lr"] = sched(s + 1)
            opt.step()
        return self.flat(model)


class TensorFlow:
    def __init__(self):
        import hvd_bert.tf  # noqa: F401  (tf-keras, generator-based dropout, before any layer)
        import tensorflow as tf
        self.tf = tf

    def make_model(self, dropout: float = 0.0, seed: int = 0):
        keras = self.tf.keras
        keras.utils.set_random_seed(seed + D.SHIFT)
        return keras.Sequential([
            keras.layers.Dense(D.HID, activation="tanh", input_shape=(D.IN,), name="dense_in"),
            keras.layers.LayerNormalization(name="layer_norm"), keras.layers.Dropout(dropout),
            keras.layers.Dense(D.OUT, name="dense_out")])

    def loss(self, model, batch):
        x, y = batch
        tf = self.tf
        return tf.reduce_mean(tf.square(tf.cast(model(x, training=True), tf.float32) - y))

    def batch(self, x, y):
        return self.tf.constant(x), self.tf.constant(y)

    def flat(self, model):
        return np.concatenate([w.ravel() for w in model.get_weights()
                               if w.dtype != np.int64]).astype(np.float64).tolist()

    def local_grad(self, engine):
        if not engine.accumulators:  # (ZeRO stage 2: reduced after every micro-batch)
            return None
        return engine.accumulators[0].numpy().reshape(-1)[:8].tolist()

    def reference(self, cfg, world, local_b, k, steps):
        from hvd_bert.core.schedules import make_schedule
        from hvd_bert.tf.optim import build_optimizer
        tf = self.tf
        g = world * local_b * k
        model = self.make_model()
        peak = cfg.optim.peak_lr(g)
        opt = build_optimizer(cfg.optim, lr=peak)
        sched = make_schedule(cfg.schedule, peak)
        x, y = D.dataset()
        for s in range(steps):
            rows = D.global_rows(s, g)
            with tf.GradientTape() as tape:
                loss = self.loss(model, self.batch(x[rows], y[rows]))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.learning_rate.assign(sched(s + 1))
            opt.apply_gradients(zip(grads, model.trainable_variables))
        return self.flat(model)


def adapter(framework: str):
    return Torch() if framework == "pt" else TensorFlow()
