"""hvd_bert: distributed large-batch training on Horovod for TensorFlow (Keras) and PyTorch.

Subpackages:
    hvd_bert.common  framework-free core (numpy + stdlib): schedules, optimizer math,
                     batch arithmetic, shard assignment, typed configuration.
    hvd_bert.tf      TensorFlow / tf-keras frontend.
    hvd_bert.pt      PyTorch frontend.

Importing hvd_bert imports no framework. It does set ``TF_USE_LEGACY_KERAS=1`` (unless the
user set it) so that a TensorFlow imported afterwards resolves ``tf.keras`` to tf-keras,
which Horovod's Keras integration needs.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"
