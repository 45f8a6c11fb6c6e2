"""How often the workers vote on stopping (scheme.group.agree_to_stop): about every VOTE_EVERY_S
seconds of training, at global steps every worker agrees on, instead of after every step.

A sync vote is a small allreduce, started at one vote and read at the next. At a step of a
millisecond its Python cost alone was a few percent of the step (issue 27, docs/benchmarks.md
"Per-step overhead"). Voting every K steps cuts that K times; K follows the step time, so that
a signal still stops the job within about 2 * VOTE_EVERY_S seconds of training (the vote it
joins is read one interval later), however slow or fast a step is: K = 1 once a step takes
VOTE_EVERY_S or longer, and never more than MOST_STEPS.

Agreed steps: every worker must call the vote at the same global steps. The interval is chosen
from figures every worker has alike: the global steps of the last votes, and the mean time
between two votes, which the vote itself sums across workers (an integer, so the sum is exact
and the same everywhere; the scheme's vote_gap_s). Where the workers' steps do not agree (async:
each skips the others' global steps, and its vote is a local check), it votes after every step.
A --stop-at target reached at an evaluation makes the next steps vote at once, so a target stops
the run a step after it was reached, as before.
"""

from __future__ import annotations

VOTE_EVERY_S = 0.05  # seconds of training between two votes
MOST_STEPS = 64      # steps between two votes at most


class StopCadence:
    def __init__(self, every_s: float = VOTE_EVERY_S, most: int = MOST_STEPS):
        self.every_s, self.most = every_s, most
        self.reset()

    def reset(self) -> None:
        """Vote at the next step, then every step until the votes measure a step's time (the
        start, and after an elastic reset: a process that joined knows no history)."""
        self.next_step = -1
        self.every = 1
        self._votes: list[int] = []  # the global steps of the last two votes

    def due(self, global_step: int) -> bool:
        return global_step >= self.next_step

    def voted(self, global_step: int, gap_s: float) -> None:
        """A vote at ``global_step``; ``gap_s``: the workers' mean seconds between the two votes
        before this one, as the vote read here carried it (0: none was read)."""
        votes = self._votes
        if gap_s > 0 and len(votes) == 2 and votes[1] > votes[0]:
            per_step = gap_s / (votes[1] - votes[0])
            self.every = max(1, min(self.most, int(self.every_s / per_step)))
        self._votes = [*votes[-1:], global_step]
        self.next_step = global_step + self.every
