"""The TensorFlow backend refuses what only the PyTorch BERT has, in one line each, before it
reads or builds anything: packed batches (``pack_sequences``) and compiled layers
(``compile_layers``). The jobs refuse both earlier, in the config (tests/core/test_config.py);
these are for code that calls the backend itself."""

import pytest

from hvd_bert.config import ConfigError
from hvd_bert.tf.backend import BACKEND


def test_packed_batches_are_refused_before_the_folder_is_read(tmp_path):
    with pytest.raises(ConfigError, match=r"packed sequences are PyTorch's only .*--framework pt"):
        BACKEND.record_batches(str(tmp_path / "absent"), "bert-pretraining", 0, 1, 8, seed=0,
                               shuffle_buffer=1, record_striding=False, start=0, pack=True)


def test_compiled_layers_are_refused():
    with pytest.raises(ConfigError, match=r"compile_layers is PyTorch's .*compile_layers=false"):
        BACKEND.compile_layers(None)
