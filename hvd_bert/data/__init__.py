"""Data preparation and readers, framework-free: published formats in, TFRecord shards with a
``dataset.json`` sidecar out, and the record streams a rank reads.

    records     TFRecord framing and tf.train.Example, by hand; DatasetError
    text_input  input text: plain, Wikipedia dumps (WikiExtractor), JSON lines; sentence splitting
    corpus      the built-in corpus (Python standard library docstrings)
    vocab       WordPiece vocabularies: training one, resolving --vocab, checking a checkpoint's
    bert        BERT pretraining instances (Google's create_pretraining_data) and classification sets
    glue        GLUE's published TSV layouts
    squad       SQuAD v1.1 / v2.0 features (Google's run_squad)
    ncf         MovieLens ratings (ml-1m, ml-20m, ml-25m) and synthetic sets -> NCF leave-one-out data
    padding     batches trimmed to their longest sequence
"""
