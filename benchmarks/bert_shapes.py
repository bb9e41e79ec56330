"""BERT's parameter tensors by name and shape (no framework), for benchmarks and projections."""

PRESETS = {
    # name: (hidden, layers, heads, intermediate)
    "tiny": (128, 2, 2, 512),
    "mini": (256, 4, 4, 1024),
    "small": (512, 4, 8, 2048),
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
}


def bert_parameter_shapes(preset: str = "base", vocab: int = 30522, max_pos: int = 512,
                          type_vocab: int = 2) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of BertForPreTraining (decoder weight tied to the
    word embeddings), vocab padded to a multiple of 8."""
    h, layers, _, inter = PRESETS[preset]
    vocab = (vocab + 7) // 8 * 8
    out = [("embeddings.word_embeddings.weight", (vocab, h)),
           ("embeddings.position_embeddings.weight", (max_pos, h)),
           ("embeddings.token_type_embeddings.weight", (type_vocab, h)),
           ("embeddings.LayerNorm.weight", (h,)), ("embeddings.LayerNorm.bias", (h,))]
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense"):
            out += [(p + m + ".weight", (h, h)), (p + m + ".bias", (h,))]
        out += [(p + "attention.output.LayerNorm.weight", (h,)),
                (p + "attention.output.LayerNorm.bias", (h,)),
                (p + "intermediate.dense.weight", (inter, h)), (p + "intermediate.dense.bias", (inter,)),
                (p + "output.dense.weight", (h, inter)), (p + "output.dense.bias", (h,)),
                (p + "output.LayerNorm.weight", (h,)), (p + "output.LayerNorm.bias", (h,))]
    out += [("pooler.dense.weight", (h, h)), ("pooler.dense.bias", (h,)),
            ("cls.predictions.transform.dense.weight", (h, h)),
            ("cls.predictions.transform.dense.bias", (h,)),
            ("cls.predictions.transform.LayerNorm.weight", (h,)),
            ("cls.predictions.transform.LayerNorm.bias", (h,)),
            ("cls.predictions.bias", (vocab,)),
            ("cls.seq_relationship.weight", (2, h)), ("cls.seq_relationship.bias", (2,))]
    return out
