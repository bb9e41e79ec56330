"""Framework-free core of hvd_bert (numpy and the standard library; PyYAML only where a
config file is parsed). Never imports TensorFlow, PyTorch or Horovod.

    schedules  ``step -> lr`` functions and batch scaling rules
    optim      LAMB, NVLAMB, LARS, SGD-momentum, AdamW as pure functions with explicit state
    batch      global = local x backward_passes_per_step x world_size, accumulation boundaries
    sharding   files and records to ranks, per epoch
    config     typed, documented configuration with YAML and ``--set`` overrides
"""
