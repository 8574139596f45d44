"""Fit the serving constants to the visible serving measurements and write them to
src/meshplan/calibrate/serve_constants.toml (python scripts/fit_serving.py [CSV])."""

from __future__ import annotations

import sys
from pathlib import Path

from meshplan.calibrate.serve_fit import constants_toml, fit_serving

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "validation" / "inference_visible.csv"


def main() -> int:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    consts = fit_serving(src)
    out = ROOT / "src" / "meshplan" / "calibrate" / "serve_constants.toml"
    out.write_text(constants_toml(consts, "shared/validation/" + src.name))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
