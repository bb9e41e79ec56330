"""The PyTorch CPU kernels, compiled once per CPU model with the system C compiler.

    build           compiling and loading the C sources (the cache folder, threads)
    gelu            bias + GELU as one loop (the intermediate layer)
    dropout         counter-based dropout masks, drawn inside the loop that applies them
    optim           LAMB / NVLAMB / LARS steps and the global norm over a list of tensors
    tied_embedding  the word embeddings and the tied decoder sharing one gradient buffer
"""
