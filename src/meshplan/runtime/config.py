"""What one ``meshplan run`` does, as a frozen config that travels to every torchrun worker as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from meshplan.spec.io import plan_from_dict
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A training run: plan, model reference, data, optimizer, checkpoints and measurements."""

    plan: Plan
    """The parallel layout and workload (global batch, seq_len)."""
    model: str
    """Catalog model name, meshplan model file, or Hugging Face config.json path."""
    steps: int = 10
    """Optimizer steps to reach (a resumed run continues up to this step)."""
    seed: int = 0
    """Seed of the weights and the data stream."""
    data: str = "synthetic"
    """``synthetic``, ``corpus`` (the shipped text) or a text-file path."""
    lr: float = 3e-3
    """AdamW learning rate."""
    max_norm: float = 1.0
    """Gradient-norm clipping threshold (0 = off)."""
    checkpoint_dir: str = ""
    """Folder of DCP checkpoints (empty = no checkpoints)."""
    checkpoint_every: int = 0
    """Save every K steps (0 = only at the end when checkpoint_dir is set)."""
    resume: bool = False
    """Start from the newest complete checkpoint in checkpoint_dir."""
    profile_steps: tuple[int, ...] = ()
    """Steps to record with the PyTorch profiler."""
    out_dir: str = ""
    """Folder for metrics.jsonl and profiler traces (empty = stdout only)."""
    timeout_s: float = 60.0
    """Process-group timeout (s): a dead peer ends the run after at most this long."""
    fail_at_step: int = 0
    """Testing hook: rank 1 (or 0 alone) SIGKILLs itself at the start of this step (0 = never)."""
    extra: dict = field(default_factory=dict)
    """Free-form labels copied into the summary."""

    def to_json(self) -> str:
        """JSON text the workers read back with from_json."""
        d = asdict(self)
        d["plan"] = self.plan.to_dict()
        return json.dumps(d)

    @staticmethod
    def from_json(text: str) -> "RunConfig":
        """Inverse of to_json."""
        d = json.loads(text)
        d["plan"] = plan_from_dict(d["plan"])
        d["profile_steps"] = tuple(d.get("profile_steps", ()))
        return RunConfig(**d)
