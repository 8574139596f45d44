"""Shared test fixtures: paths to the shared validation data beside the clone."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNS_CSV = ROOT.parent / "shared" / "validation" / "runs_visible.csv"


@pytest.fixture(scope="session")
def runs_csv() -> Path:
    if not RUNS_CSV.is_file():
        pytest.skip(f"validation data not found at {RUNS_CSV}")
    return RUNS_CSV
