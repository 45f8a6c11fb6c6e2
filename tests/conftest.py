"""For every test: none may leave a tracker's store in the repository's folder. MLflow 3's
default store is ./mlflow.db of the working folder, and one was committed by accident once;
a run keeps its stores in its run folder."""

import pytest

from launch import REPO

STORES = ("mlflow.db", "mlruns", "mlartifacts", "wandb")


@pytest.fixture(scope="session", autouse=True)
def _no_tracker_store_in_the_repository():
    before = {name for name in STORES if (REPO / name).exists()}
    yield
    made = [name for name in STORES if (REPO / name).exists() and name not in before]
    if made:
        pytest.fail(f"a test wrote {', '.join(made)} into {REPO}: give its run a --run-dir, "
                    "or MLflow a store, in the test's tmp_path", pytrace=False)
