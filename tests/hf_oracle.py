"""Random ``transformers`` BERTs of odd sizes and their logits: the oracle of the Hugging Face
checkpoint tests of both frameworks (tests/pt/test_hf_checkpoints.py, tests/tf/test_hf_tf.py)."""

import numpy as np
import torch
import transformers

CONFIGS = {
    "erf": dict(vocab_size=1001, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                intermediate_size=96, hidden_act="gelu", type_vocab_size=2, max_position_embeddings=40),
    "tanh": dict(vocab_size=203, hidden_size=36, num_hidden_layers=3, num_attention_heads=3,
                 intermediate_size=50, hidden_act="gelu_new", type_vocab_size=3, max_position_embeddings=24,
                 layer_norm_eps=1e-7),
}


def hf_model(kind, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(**CONFIGS[kind])
    model = transformers.BertForPreTraining(cfg).eval()
    with torch.no_grad():  # random biases and norms too, so that every mapping is exercised
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def batch(cfg, seed=1, b=3, s=11, p=4):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[1, 7:] = 0  # padding
    mask[2, 4:] = 0
    seg = torch.randint(0, cfg.type_vocab_size, (b, s), generator=g)
    pos = torch.randint(0, s, (b, p), generator=g)
    return ids, seg, mask, pos


def hf_logits(model, ids, seg, mask, pos):
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=seg, attention_mask=mask)
    logits = out.prediction_logits
    mlm = torch.gather(logits, 1, pos[..., None].expand(-1, -1, logits.shape[-1]))
    return mlm.numpy(), out.seq_relationship_logits.numpy()


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


