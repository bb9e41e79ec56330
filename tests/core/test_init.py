"""Layout-independent initialisation (hvd_bert/core/init.py): one seed per tensor name, BERT's rule."""

import pytest

from hvd_bert.core.init import bert_rule, tensor_seed


def test_a_tensor_s_seed_depends_on_the_seed_and_its_name_only():
    assert tensor_seed(0, "layers.0.query.weight") == tensor_seed(0, "layers.0.query.weight")
    seeds = {tensor_seed(s, n) for s in (0, 1) for n in ("layers.0.query.weight", "layers.1.query.weight")}
    assert len(seeds) == 4 and all(0 <= s < 2 ** 63 for s in seeds)


@pytest.mark.parametrize("name,rule", [
    ("layers.0.query.weight", "normal"), ("embeddings.word_embeddings.weight", "normal"),
    ("layers.0.query.bias", "zeros"), ("mlm_bias", "zeros"), ("layers.3.output_LayerNorm.weight", "ones"),
    ("embeddings.LayerNorm.bias", "zeros"), ("nsp.weight", "normal")])
def test_bert_s_rule(name, rule):
    assert bert_rule(name, 0.02)[0] == rule
