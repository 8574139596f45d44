"""Pipeline actions: what one rank does for one (stage, micro-batch), spelled as torch.distributed.pipelining
spells them in its custom-schedule CSV files (``3F7`` = forward of stage 3 on micro-batch 7).

Stages are numbered in pipeline order (0 .. n_stages-1); which rank holds a stage is the schedule's placement.
"""

from __future__ import annotations

import re
from typing import NamedTuple

FORWARD = "F"
"""Forward of one stage on one micro-batch."""
BACKWARD_INPUT = "I"
"""Input-gradient half of the backward (Qi et al. 2023 'B'); frees most activations, passes the gradient on."""
BACKWARD_WEIGHT = "W"
"""Weight-gradient half of the backward (Qi et al. 2023 'W'); needs no communication and can be deferred."""
FULL_BACKWARD = "B"
"""Fused backward: I and W in one action."""
COMPUTE_KINDS = (FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD)
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
"""Communication actions of torch's lowered ("compute_comms") format; the simulator derives its own sends."""
IGNORED_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
"""FSDP/gradient bookkeeping actions of torch's lowered format; their cost comes from ``StageTimes.dp_tail``."""

# Longest alternatives first so that "SEND_F" is never read as stage + "S".
_TOKEN = re.compile(r"^(\d+)(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B|F|I|W|B)(\d*)$")


class Action(NamedTuple):
    """One compute action of a schedule. A NamedTuple rather than a dataclass: schedules hold up to ~10^6 of
    them and build them in tight loops, where tuple construction is several times cheaper."""

    kind: str
    """One of ``F``, ``I``, ``W``, ``B``."""
    stage: int
    """Virtual stage in pipeline order (0-based)."""
    microbatch: int
    """Micro-batch index (0-based)."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    def label(self, chunk: int) -> str:
        """Human name for traces, e.g. ``F s3 mb7 c1``."""
        return f"{self.kind} s{self.stage} mb{self.microbatch} c{chunk}"


def parse_token(token: str) -> tuple[str, int, int | None] | None:
    """Split a torch action string into (kind, stage, micro-batch or None); None for an empty cell.

    Raises:
        ValueError: the token is not ``<stage><KIND><microbatch>``.
    """
    text = token.strip()
    if not text:
        return None
    match = _TOKEN.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not <stage><F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B><microbatch>, e.g. 2F0")
    stage, kind, mb = match.groups()
    return kind, int(stage), int(mb) if mb else None
