"""The engine tests' shared pieces: one PostgreSQL cluster for the session, started and stopped here, and a data
root of vTrain's A100 rows that the trainings share (its graph cache is built once)."""

from pathlib import Path

import pytest

from tests.engines.services import Postgres, postgres_missing


@pytest.fixture(scope="session")
def postgres():
    missing = postgres_missing()
    if missing:
        pytest.skip(missing)
    pg = Postgres().start()
    yield pg
    pg.stop()


@pytest.fixture(scope="session")
def vtrain_root(tmp_path_factory) -> Path:
    """A data root (``python -m gnn.train --data``) holding vTrain's A100 rows and the repo's hardware records."""
    repo = Path(__file__).resolve().parents[2]
    root = tmp_path_factory.mktemp("vtrain")
    (root / "runs").mkdir()
    (root / "runs" / "vtrain-a100.parquet").symlink_to(repo / "data" / "runs" / "vtrain-a100.parquet")
    (root / "hardware").symlink_to(repo / "data" / "hardware")
    return root
