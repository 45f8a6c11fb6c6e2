"""Asynchronous training through a parameter server written with mpi4py.

protocol.py  tags, header layout, shard/chunk arithmetic, the staleness rule (no MPI calls)
server.py    ParameterServer: applies pushed gradients with a server-side optimizer
client.py    ParameterServerClient: the worker-side update scheme behind the trainer
"""
