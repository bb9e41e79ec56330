"""Data preparation and readers, framework-free: published formats in, TFRecord shards with a
``dataset.json`` sidecar out, and the record streams a rank reads.

    records         TFRecord framing, decoding examples, the reading order
    example_proto   tf.train.Example's protobuf wire format, by hand
    errors          DatasetError, CorruptRecordError
    sidecar         a prepared folder's dataset.json: written last, checked by every reader
    kinds           the prepared kinds (pretraining, classification, SQuAD, tokens) and their layouts
    output          writing a prepared folder safely across ranks (overwrite, errors, commit)
    text_input      input text: plain, Wikipedia dumps, Google's format, JSON lines; sentences
    corpus          the built-in corpus (Python standard library docstrings)
    vocab           WordPiece vocabularies: training, the tokenizer, resolving --vocab, checking
    masking         Google's create_pretraining_data: sentence pairs and masked-LM records
    pretraining     text -> pretraining shards, across ranks (hvd-bert prepare-bert)
    classification  TSV/CSV or GLUE -> classification shards (hvd-bert prepare-classification)
    glue            GLUE's published TSV layouts
    squad           SQuAD v1.1 / v2.0 -> features (hvd-bert prepare-squad)
    squad_json      SQuAD's JSON files, read and checked against its structure
    token_classification  CoNLL-2003 files -> token classification (NER) shards
    finetune        the sets a fine-tuning run takes: its task, checks, steps per epoch
    ncf             MovieLens or synthetic -> NCF data; each epoch's pairs
    movielens       MovieLens ratings in their published formats (ml-100k, ml-1m, ml-20m, ml-25m)
    padding         batches trimmed to their longest sequence
    packing         pretraining batches with several sequences per row
    defaults        the built-in data: the cache folder, the default corpus, vocab and sets
"""
