"""Typed configuration: frozen dataclasses with documented fields and checks, loaded from
YAML recipes (``recipes/*.yaml``) with type-checked ``--set`` overrides.

    base   the machinery: ``doc``, ``load_config``, ``--set`` parsing, ``--explain``, ConfigError
    train  a training run's sections: optim, schedule, batch, precision, horovod, elastic
    jobs   each job's config with its defaults: pretrain, finetune, ncf
    bert   BERT's sizes (BertConfig, the published presets)

``hvd-bert config --job J [--config R] [--set K=V]`` prints one resolved; ``--explain`` lists
every key with its type, default and documentation.
"""

from hvd_bert.config.base import (ConfigError, apply_overrides, check_applicable, doc, explain, from_dict,
                                  load_config, overlay, require, to_dict)
from hvd_bert.config.jobs import FinetuneConfig, ModelConfig, NCFConfig, PredictConfig, PretrainConfig
from hvd_bert.config.train import (OPTIM_FIELDS, BatchConfig, ElasticConfig, HorovodConfig, OptimConfig,
                                   PrecisionConfig, ScheduleConfig, TrainConfig, ZeroConfig)

__all__ = ["ConfigError", "doc", "require", "from_dict", "to_dict", "load_config", "apply_overrides",
           "overlay", "check_applicable", "explain", "OptimConfig", "ScheduleConfig", "BatchConfig",
           "PrecisionConfig", "HorovodConfig", "ElasticConfig", "ZeroConfig", "TrainConfig", "OPTIM_FIELDS",
           "PretrainConfig", "FinetuneConfig", "NCFConfig", "ModelConfig", "PredictConfig", "JOB_CONFIGS"]

JOB_CONFIGS = {"train": TrainConfig, "pretrain": PretrainConfig, "finetune": FinetuneConfig, "ncf": NCFConfig,
               "predict": PredictConfig}
