"""What one ``meshplan run`` does, as a frozen config that travels to every torchrun worker as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from meshplan import catalog
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.plan import Plan
from meshplan.spec.plan_file import plan_from_dict

RUNTIME_STACK = "meshplan"
"""The profile of the stack this runtime is (catalog/frameworks/meshplan.toml)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A training run: plan, model reference, data, optimizer, checkpoints and measurements."""

    plan: Plan
    """The parallel layout and workload (global batch, seq_len)."""
    model: str
    """Catalog model name, meshplan model file, or Hugging Face config.json path."""
    stack: FrameworkProfile = field(default_factory=lambda: catalog.framework(RUNTIME_STACK))
    """The runtime's own profile, with any settings changed (it honours ``fused_optimizer``: foreach AdamW or the
    per-tensor loop); whatever stack the plan names, this runtime runs it."""
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
    pools: tuple[int, ...] = ()
    """GPUs of each pool of the cluster the plan was made for, in order (its ``batch_shares`` are per pool: replica
    d runs the share of the pool holding it); empty = one pool of the whole world."""
    switches: tuple[dict, ...] = ()
    """Live layout switches: ``{"step": S, "plan": {...}}`` moves the state to that plan after step S
    (``runtime.switch``); ``"check": true`` also loads B from a DCP checkpoint of A and reports whether both are
    bit-equal; ``"dry_run": true`` plans and prices the move without moving anything."""
    extra: dict = field(default_factory=dict)
    """Free-form labels copied into the summary."""

    def __post_init__(self) -> None:
        if self.stack.name != RUNTIME_STACK:
            from meshplan.errors import SpecError

            raise SpecError("run.stack", self.stack.name, f"meshplan's runtime is the {RUNTIME_STACK} stack; predict "
                            f"what it runs with --framework {RUNTIME_STACK}")

    def pool_sizes(self) -> tuple[int, ...]:
        """``pools``, or one pool of the plan's GPUs."""
        return self.pools or (self.plan.n_gpus,)

    def switch_plans(self) -> list[tuple[int, Plan, dict]]:
        """(step, plan, options) of every switch, in step order."""
        return sorted(((int(s["step"]), plan_from_dict(s["plan"], f"switch@{s['step']}"), s)
                       for s in self.switches), key=lambda x: x[0])

    def to_json(self) -> str:
        """JSON text the workers read back with from_json."""
        d = asdict(self)
        d["plan"] = self.plan.to_dict()
        d["stack"] = self.stack.changes_from(catalog.framework(self.stack.name))
        return json.dumps(d)

    @staticmethod
    def from_json(text: str) -> "RunConfig":
        """Inverse of to_json."""
        d = json.loads(text)
        d["plan"] = plan_from_dict(d["plan"])
        d["stack"] = catalog.framework_with(RUNTIME_STACK, d.get("stack"))
        d["profile_steps"] = tuple(d.get("profile_steps", ()))
        d["switches"] = tuple(d.get("switches", ()))
        d["pools"] = tuple(d.get("pools", ()))
        return RunConfig(**d)
