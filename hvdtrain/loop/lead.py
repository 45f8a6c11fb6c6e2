"""The lead's roles move when the lead is lost. The lead (worker 0) evaluates, writes the
checkpoints and the log, and decides for the others (scheme.group.leads). Async training under
mpirun's recovery settings goes on without a lost worker (ps/membership.py); when the lost one
is the lead, the survivors all pick the lowest live worker (ps/survivors.py), whose scheme
calls take_lead, at a step or inside a wait for the others. Only local work happens here:
opening files, no collective, so it is safe wherever the scheme learns of the loss.

Left behind by the lost lead: the evaluation it was running and the epoch lines its sums had
not completed (the new lead writes those that are not in the log yet), and a checkpoint write
in flight (the previous checkpoint stays intact, the next one comes at the usual cadence)."""

from __future__ import annotations


def take_lead(trainer) -> None:
    trainer.is_main = True
    trainer.checkpointer.take_over()
    trainer.best.take_over()
    survivors = getattr(trainer.scheme, "survivors", None)  # the async schemes' (ps/)
    trainer.log.take_over(trainer.run_dir, sorted(survivors.lost) if survivors else [])
