"""PyTorch frontend of hvd_bert."""
