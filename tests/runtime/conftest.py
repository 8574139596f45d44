"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def local_profile(tmp_path_factory) -> str:
    """This host calibrated once by ``meshplan calibrate`` (what ``meshplan check`` does first), shared by the
    calibrate, training-check and serving-check tests."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("hw") / "local.toml"
    proc = subprocess.run([sys.executable, "-m", "meshplan.cli", "calibrate", "--out", str(out), "--nproc", "2",
                           "--min-time", "0.05"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out)
