#!/usr/bin/env python
"""Refit the live-switch overheads (fixed, per tensor) from the published switches in
src/meshplan/calibrate/transition_anchors.toml and write transition_constants.toml.
Usage: python scripts/fit_transition.py"""

import sys

from meshplan.calibrate.transition_fit import main

if __name__ == "__main__":
    sys.exit(main(["--write"]))
