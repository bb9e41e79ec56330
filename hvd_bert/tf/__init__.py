"""TensorFlow / tf-keras frontend of hvd_bert.

Horovod's Keras integration needs Keras 2 (tf-keras): ``tf.keras`` must resolve to tf-keras,
which TensorFlow >= 2.16 does only when ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is
first imported. Importing ``hvd_bert`` sets it; :func:`check_keras` explains the fix when
TensorFlow was imported first without it.
"""

import os

import hvd_bert  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)

# TensorFlow's start-up lines (oneDNN, CUDA drivers not found) are INFO/WARNING: keep them out of
# the jobs' output unless the user asks for them.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def init_horovod(horovod_cfg=None) -> None:
    """``hvd.init()`` once, with the ``horovod.*`` settings (``hvd_bert.cluster.init_horovod``)."""
    import horovod.tensorflow as hvd

    from hvd_bert import cluster

    cluster.init_horovod(hvd, horovod_cfg)


def check_keras() -> None:
    """Raise a clear error unless ``tf.keras`` is tf-keras (Keras 2)."""
    import tensorflow as tf

    if not tf.keras.layers.Dense.__module__.startswith("tf_keras"):
        raise RuntimeError(
            "tf.keras is Keras 3 in this process, but Horovod's Keras integration and hvd_bert.tf "
            "need tf-keras: TensorFlow was imported before hvd_bert without TF_USE_LEGACY_KERAS=1. "
            "Import hvd_bert before tensorflow, or export TF_USE_LEGACY_KERAS=1, and install "
            "tf-keras==2.21.0")
