"""The planner's memory limit per software stack: how close to device memory a stack's predicted peak may come, from
the published runs of that stack that ran.

The old single rule (no out-of-memory below 80 % of device memory in one study of 454 runs, ``DEFAULT``) came from
one stack with PyTorch's caching allocator fragmenting activations. Megatron-family stacks keep parameters,
gradients and optimizer states in a few contiguous buffers allocated once (Megatron-Core
``distributed/param_and_grad_buffer.py``), so less is left to fragment, and their shipped recipes run much closer
to the device's memory: every published run is evidence that its predicted peak fitted. A stack's limit is the
largest predicted peak fraction among its published runs (rounded up to a whole per cent), never below
``DEFAULT``; a stack with fewer than ``MIN_RUNS`` runs keeps ``DEFAULT``. A run predicted above its device's
memory is a fault of the memory model, not evidence, and never raises a limit above 1.

``scripts/fit_memory_limits.py`` predicts every visible run and writes ``calibrate/memory_limits.csv`` (one row
per run: id, stack, predicted peak fraction); nothing there is edited by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from meshplan.cost.calib import shipped_rows

DEFAULT = 0.8
"""No out-of-memory was observed in a study of 454 published runs while the estimate stayed under 80 % of device
memory; the limit of a stack without enough published runs of its own."""

MIN_RUNS = 3
"""Published runs a stack needs before its own record sets its limit."""

LIMITS_FILE = "memory_limits.csv"


@dataclass(frozen=True, kw_only=True)
class RunPeak:
    """One published run's predicted peak memory."""

    id: str
    stack: str
    """The stack profile it was predicted under (``FrameworkProfile.name``)."""
    fraction: float
    """Predicted peak per GPU / device memory of its tightest GPU."""


@dataclass(frozen=True, kw_only=True)
class MemoryLimit:
    """A stack's memory limit and where it comes from."""

    fraction: float
    """Largest predicted peak per GPU the planner admits, as a share of device memory."""
    why: str
    """e.g. ``largest predicted peak of 20 published nemo runs`` or ``default: 1 published run``."""


def limit_from(peaks: list[RunPeak], stack: str) -> MemoryLimit:
    """The limit of ``stack`` from these runs' predicted peaks."""
    own = [p.fraction for p in peaks if p.stack == stack]
    if len(own) < MIN_RUNS:
        return MemoryLimit(fraction=DEFAULT, why=f"{len(own)} published {stack} runs, the 80 % rule of one study")
    top = min(max(own), 1.0)
    frac = max(DEFAULT, math.ceil(100 * top - 1e-9) / 100)
    return MemoryLimit(fraction=frac, why=f"largest predicted peak of {len(own)} published {stack} runs that ran"
                       if frac > DEFAULT else f"{len(own)} published {stack} runs, all under the 80 % rule")


@lru_cache(maxsize=1)
def shipped() -> tuple[RunPeak, ...]:
    """The predicted peaks ``scripts/fit_memory_limits.py`` wrote."""
    return tuple(RunPeak(id=r["id"], stack=r["stack"], fraction=float(r["peak_fraction"]))
                 for r in shipped_rows(LIMITS_FILE))


def stack_limit(stack: str) -> MemoryLimit:
    """The shipped memory limit of the stack named ``stack``."""
    return limit_from(list(shipped()), stack)
