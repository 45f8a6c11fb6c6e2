"""Asynchronous training through a parameter server written with mpi4py.

protocol.py  tags, header layout, shard/chunk arithmetic (no MPI calls)
server.py    ParameterServer: the message loop; what a push does is the server engine's
             (engines/server_engine.py, by the rules of hvdtrain/rules/), which answers through
             pushes.py's ShardPort; shard.py, pauses.py, verdicts.py, silence.py and
             server_stats.py are its MPI-bound pieces
client.py    ParameterServerClient: the worker-side update scheme behind the trainer; its parts
             are server_link.py (the messages to the servers), worker_group.py (the workers'
             sums, votes and broadcasts), stop_votes.py, flat_parameters.py and slot_feed.py
"""
