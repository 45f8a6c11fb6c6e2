"""The doctor's run-folder test (doctor/measure.py run_dir_test) on one rank, with a stand-in for
MPI's communicator: a folder it cannot write is a finding, never a crash (a --run-dir under a
file raised NotADirectoryError outside the test's try, and the doctor then blamed the network
for the ranks it left hanging)."""

from hvdtrain.doctor.measure import run_dir_test


class OneRank:
    def Get_rank(self):
        return 0

    def bcast(self, value, root=0):
        return value

    def Barrier(self):
        pass


def test_a_folder_under_a_file_is_reported_not_writable(tmp_path):
    (tmp_path / "afile").write_text("")
    for run_dir in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        result = run_dir_test(OneRank(), str(run_dir))
        assert result["writable"] is False and not result["sees_rank0"], result
        assert result["error"].startswith(("NotADirectoryError", "FileExistsError")), result


def test_a_writable_folder_is_seen_and_left_as_it_was(tmp_path):
    result = run_dir_test(OneRank(), str(tmp_path / "runs"))
    assert result["writable"] and result["sees_rank0"] and result["error"] is None
    assert not (tmp_path / "runs").exists()  # made for the test, removed after it
