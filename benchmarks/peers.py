"""What the benchmarks share about their peers: ``transformers``' BERT config for one of
hvd_bert's (the same sizes, the padded vocabulary, dropout, and ``gelu_new``: the tanh GELU)."""


def transformers_bert_config(cfg, **extra):
    import transformers

    return transformers.BertConfig(
        vocab_size=cfg.padded_vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
        hidden_act="gelu_new", max_position_embeddings=cfg.max_position_embeddings,
        hidden_dropout_prob=cfg.hidden_dropout, attention_probs_dropout_prob=cfg.attention_dropout,
        layer_norm_eps=cfg.layer_norm_eps, **extra)
