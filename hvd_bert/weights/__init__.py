"""Published BERT weight formats, framework-free: every checkpoint goes through the portable
form (numpy arrays under hvd_bert's names, the vocabulary padded to a multiple of 8).

    portable  the portable names and .npz; reading any published checkpoint (read_published)
    hf        Hugging Face folders (config.json + model.safetensors / pytorch_model.bin)
    google    Google's TF1 checkpoints (bert_config.json + bert_model.ckpt), their names
"""
