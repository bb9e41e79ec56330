"""The TensorFlow / tf-keras backend of hvd_bert.

    backend      what the jobs call (the train.backend.Backend protocol, in TensorFlow)
    engine       Horovod's DistributedGradientTape, accumulation, mixed precision, checkpoints
    optim        LAMB, NVLAMB, LARS as Keras optimizers (checked against core.optim)
    zero         ZeRO stages 1 and 2: the optimizer state (and gradients) split over the ranks
    sharded      sharded checkpoints: each rank's share, in the background, read under any layout
    callbacks    Keras fit() callbacks: the schedule, Horovod's broadcast and metric average
    data         the tf.data reader (the core's reading order)
    kernels      XLA-fused GELU
    google_ckpt  reading and writing Google's TF1 checkpoints
    models       BERT and NeuMF in Keras

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

# Lines TensorFlow's C++ core prints to stderr while it loads, before its logging is set up
# (so TF_CPP_MIN_LOG_LEVEL cannot silence them); dropped unless TF_CPP_MIN_LOG_LEVEL is 0.
_STARTUP_NOISE = ("All log messages before absl::InitializeLog()", "oneDNN custom operations are on",
                  "Could not find cuda drivers", "Unable to register cu",
                  "computation placer already registered", "This TensorFlow binary is optimized",
                  "rebuild TensorFlow with the appropriate compiler flags", "TF-TRT Warning",
                  "failed call to cuInit")


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with file descriptor 2 captured; pass on every line but the start-up
    noise above (an import error is still raised, and its output still shown)."""
    import sys
    import tempfile

    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # the CUDA probe (cuInit) prints here, not later
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not any(n in ln for n in _STARTUP_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


_import_tensorflow_quietly()


def _use_generator_rng() -> None:
    """Keras layers draw dropout masks from a ``tf.random.Generator`` (a variable) instead of
    stateful random ops, whose state no checkpoint can hold: the engine saves every rank's
    generator state, so a resumed run with dropout continues bit-identically. Must be set
    before any layer is built, hence here."""
    import tensorflow as tf

    if tf.keras.layers.Dense.__module__.startswith("tf_keras"):
        tf.keras.backend.experimental.enable_tf_random_generator()


_use_generator_rng()


def init_horovod(horovod_cfg=None) -> None:
    """``hvd.init()`` once, with the ``horovod.*`` settings (``hvd_bert.cluster.horovod.init_horovod``)."""
    import horovod.tensorflow as hvd

    from hvd_bert.cluster import horovod as cluster

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
