"""The update rules, one file each, free of MPI: when a reply may go and when a round closes
(ssp.py: async and SSP; bsp.py: lock-step rounds; backup.py: backup workers), what a round
averages (accumulator.py), how one gradient is weighted or corrected before the optimizer step
(apply.py, staleness_lr.py, dc_asgd.py), what the rules record (statistics.py), what a local SGD or DiLoCo round
makes of the workers' parameters (local_sgd.py), and the names of the comparison's modes
(registry.py).

The parameter server (ps/server.py) and the simulator (compare/sim/) both build these
objects with registry.server_rules and hand them to the same server engine (engines/server_engine.py),
so the two cannot disagree on what a rule does."""
