"""hvdtrain: synchronous (Horovod) and asynchronous (MPI parameter server) distributed training
for PyTorch, driven by one trainer loop."""

__version__ = "0.1.0"
