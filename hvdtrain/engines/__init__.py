"""Each scheme's algorithm, written once: the sync step, local-SGD/DiLoCo rounds and the
parameter server's push handling. No MPI, no Horovod and no clock here: an engine reaches the
other workers only through a collective port (ports.py), and the server engine answers through
a message port (server.py ServerPort), as ps-lite's request handler answers through one
Response call. The backends (sync/ for Horovod and torch.distributed, ps/ for the
mpi4py parameter server, compare/sim/ for the simulator) move the bytes and keep the time."""
