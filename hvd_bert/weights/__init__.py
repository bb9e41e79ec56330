"""Published BERT weight formats, framework-free: every checkpoint goes through the portable
form (numpy arrays under hvd_bert's names, the vocabulary padded to a multiple of 8).

    portable   the portable names and .npz; fitting weights to a model
    published  which published checkpoint a path is, read (Hugging Face, Google, NVIDIA)
    lazy       tensors read when used, and a rank's share of one read alone (tensor parallelism)
    hf         Hugging Face folders (config.json + model.safetensors / pytorch_model.bin)
    google     Google's TF1 checkpoints (bert_config.json + bert_model.ckpt), their names
    convert    hvd-bert convert: any checkpoint -> .npz, a Hugging Face folder or a Google checkpoint
"""
