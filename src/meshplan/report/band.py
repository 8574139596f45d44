"""How a prediction's error band reads (``cost.bands``): the measured step times it allows, where it comes
from, and the flag when no validated run covers the layout."""

from __future__ import annotations

from meshplan.cost.bands import Band


def band_text(band: Band | None, step: float) -> str:
    """``2.81-3.02 s (-4/+3 %, pp on hopper, 31 runs)``, with the coverage flag; ``-`` without bands."""
    if band is None:
        return "- (no error bands shipped)"
    fast, slow = band.interval(step)
    text = (f"{fast:.3f}-{slow:.3f} s measured ({100 * (fast / step - 1):+.0f}/{100 * (slow / step - 1):+.0f} %, "
            f"from {band.group})")
    return text + (f"; NOT COVERED: {band.note}" if not band.covered else "")


def band_json(band: Band | None, step: float) -> dict | None:
    """JSON view of a band for one predicted step time."""
    if band is None:
        return None
    fast, slow = band.interval(step)
    return {"level": 0.8, "measured_fast_s": fast, "measured_slow_s": slow, "error_lo": band.lo,
            "error_hi": band.hi, "group": band.group, "covered": band.covered, "note": band.note}
