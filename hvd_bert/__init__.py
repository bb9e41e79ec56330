"""hvd_bert: distributed large-batch training on Horovod for TensorFlow (Keras) and PyTorch.

Subpackages (docs/architecture.md has the map). Framework-free (numpy, the standard library,
the data libraries):
    core        the math: optimizers, schedules, batch arithmetic, sharding, the cost model
    config      typed configuration: sections, job configs, BERT sizes, recipes
    data        data preparation and readers (published formats -> TFRecord shards)
    weights     published weight formats (Hugging Face, Google, NVIDIA) and the portable form
    evaluation  SQuAD, GLUE, NCF and pretraining metrics, computed exactly across ranks
    train       the training run: backend and engine protocols, the loop, checkpoints, the log
    jobs        pretrain, finetune, ncf: each written once as run(cfg, backend)
    cluster     Horovod's initialisation, launching, doctor
    files       writing files safely: atomic, never through a planted link, resource errors named
    stop        how a run ends: the exit statuses, this process's stop request (SIGTERM, Ctrl-C)
    cli         the hvd-bert command: dispatches each subcommand (cli_args: its arguments;
                cli_prepare: the data-preparation commands)
The two backends, which never import each other:
    pt          PyTorch (models, engine, reader, kernels/)
    tf          TensorFlow / tf-keras (models, engine, reader, Keras callbacks)

Importing hvd_bert imports no framework. It does set ``TF_USE_LEGACY_KERAS=1`` (unless the
user set it) so that a TensorFlow imported afterwards resolves ``tf.keras`` to tf-keras,
which Horovod's Keras integration needs.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"
