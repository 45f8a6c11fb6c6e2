"""Synchronous data parallelism: the backends that run the sync and local-SGD engines
(engines/sync_step.py, engines/local_rounds.py) over a collective port.

- collective.py: CollectiveSync, sync's scheme over any port; local_rounds_scheme.py: local SGD
  and DiLoCo (``--local-steps H``) over any port.
- Horovod, the default: horovod_port.py (the port), horovod.py (HorovodSync: Horovod's
  DistributedOptimizer, the zero-copy gradient buffer of flat_gradients.py, Adasum,
  SyncBatchNorm), shares.py (``--balance``), elastic.py (``--elastic``).
- torch.distributed (``--collective torch``): torch_collective.py, torch_runtime.py.

Nothing is imported here, so that importing one backend does not import the other.
"""
