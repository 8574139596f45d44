#!/usr/bin/env python
"""Run every benchmark in this folder in turn (``make bench``); each prints its own figures."""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

for path in sorted(HERE.glob("bench_*.py")):
    print(f"== {path.name}", flush=True)
    sys.argv = [str(path)]
    runpy.run_path(str(path), run_name="__main__")
