"""PyTorch models: BERT (``bert``) and NeuMF (``ncf``), free of parallelism."""
