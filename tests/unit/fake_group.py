"""Fake groups of workers (hvdtrain/scheme.py Group) for the loop's in-process tests."""

from __future__ import annotations

from hvdtrain.scheme import Group


class OneProcess(Group):
    """This process alone: a sum is its own values, a broadcast its own object."""

    def workers(self):
        return 0, 1

    def sum_across_workers(self, values):
        return list(values)

    def broadcast_object(self, obj):
        return obj


class OwnGroup:
    """Mixed into a fake scheme for code that asks only the scheme's group (the run log, the
    stop): the fake is its own group, so a test sets and reads its figures in one place."""

    @property
    def group(self):
        return self
