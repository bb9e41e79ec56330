"""NeuMF (GMF + MLP) in TensorFlow/Keras, the same model and initialisation as
``hvd_bert.pt.models.ncf``; the job is ``hvd_bert.jobs.ncf``."""

from __future__ import annotations

import hvd_bert.tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

__all__ = ["NeuMF", "ncf_loss"]


class NeuMF(tf.keras.Model):
    """``call({"users", "items"})`` -> float32 logits ``[B]``; NVIDIA's initialisation."""

    def __init__(self, n_users: int, n_items: int, factors: int = 64,
                 layers: tuple[int, ...] = (256, 256, 128, 64), dropout: float = 0.0, **kw):
        super().__init__(**kw)
        half = layers[0] // 2
        def emb(n, d, name):  # a fresh initialiser each: one instance would repeat its values
            return tf.keras.layers.Embedding(n, d, name=name,
                                             embeddings_initializer=tf.keras.initializers.RandomNormal(stddev=0.01))

        self.mf_user, self.mf_item = emb(n_users, factors, "mf_user"), emb(n_items, factors, "mf_item")
        self.mlp_user, self.mlp_item = emb(n_users, half, "mlp_user"), emb(n_items, half, "mlp_item")
        self.mlp = [tf.keras.layers.Dense(w, activation="relu", kernel_initializer="glorot_uniform",
                                          name=f"mlp_{i}") for i, w in enumerate(layers[1:])]
        self.drop = tf.keras.layers.Dropout(dropout)
        self.final = tf.keras.layers.Dense(1, kernel_initializer="lecun_uniform", name="final")

    def call(self, batch, training=False):
        u, i = batch["users"], batch["items"]
        gmf = self.mf_user(u) * self.mf_item(i)
        x = tf.concat([self.mlp_user(u), self.mlp_item(i)], axis=-1)
        for layer in self.mlp:
            x = self.drop(layer(x), training=training)
        return tf.cast(tf.squeeze(self.final(tf.concat([gmf, x], axis=-1)), -1), tf.float32)


def ncf_loss(model, batch):
    logits = model(batch, training=True)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["labels"], logits=logits))
