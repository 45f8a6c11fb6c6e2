"""The doctor's ranks yield their core while they wait (rank.yield_while_waiting): on a host with
fewer cores than ranks, ranks spinning in a receive starved the pair measuring its link (three
namespace hosts on two cores: ~20 Mbit/s measured on every link, a 100 Mbit/s one included)."""

import inspect

from hvdtrain.doctor import rank
from hvdtrain.doctor.rank import yield_while_waiting


def test_the_ranks_yield_while_they_wait_unless_told_otherwise():
    env = {}
    yield_while_waiting(env)
    assert env == {"OMPI_MCA_mpi_yield_when_idle": "1"}
    told = {"OMPI_MCA_mpi_yield_when_idle": "0"}
    yield_while_waiting(told)
    assert told == {"OMPI_MCA_mpi_yield_when_idle": "0"}


def test_it_is_set_before_mpi_starts():
    # Open MPI reads it at MPI_Init, which importing mpi4py.MPI runs: gather() sets it first.
    source = inspect.getsource(rank.gather)
    assert source.index("yield_while_waiting()") < source.index("from mpi4py import MPI")
