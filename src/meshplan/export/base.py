"""The exporter protocol and its registry: one module per framework, looked up by name.

An exporter turns (model, plan, stack profile) into the text a framework reads. Whatever the framework cannot
express is not dropped silently: it is listed in ``ExportResult.approximations`` (the CLI prints them on stderr,
writes them as comments into the file, and exits non-zero unless ``--allow-approximate``). A plan the framework
cannot launch at all is refused with an ``ExportError`` (exit 2, whatever ``--allow-approximate`` says). Each export
names the framework release it targets in its header. Exporters never import torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

from meshplan import catalog
from meshplan.errors import MeshplanError, SpecError, unknown_name
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

# module path and class name of every built-in exporter; adding one is a module plus a line here
_BUILTIN = (
    ("meshplan.export.megatron", "MegatronExporter"),
    ("meshplan.export.torchtitan", "TorchtitanExporter"),
    ("meshplan.export.deepspeed", "DeepSpeedExporter"),
)


class ExportError(MeshplanError):
    """The target framework refuses the plan outright: an export would not start, so none is written."""


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """What an exporter produced."""

    text: str
    """The file contents (approximations already written into it as comments)."""
    approximations: tuple[str, ...] = ()
    """One sentence per part of the plan the framework cannot express exactly."""

    @property
    def exact(self) -> bool:
        """The framework expresses the whole plan."""
        return not self.approximations


class Exporter(Protocol):
    """A framework exporter."""

    name: str
    """Registry name used by ``meshplan export --to``."""
    stacks: tuple[str, ...]
    """The stack profiles whose behaviour the exported job has (the first is what its launch runs)."""
    formats: tuple[str, ...]
    """Output formats; the first is the default."""
    description: str
    """One line for help texts."""

    def suffix(self, fmt: str) -> str:
        """File suffix for an output format (e.g. ``.sh``)."""

    def target(self, fmt: str) -> str:
        """The framework release (and entry point) the output for ``fmt`` is written for."""

    def render(self, model: ModelSpec, plan: Plan, stack: FrameworkProfile, *, gpus: str = "",
               fmt: str = "") -> ExportResult:
        """The exported text for ``fmt`` (empty = default format) with the stack's settings where the framework
        has them, and what it approximates."""


def exporters() -> dict[str, Exporter]:
    """Every registered exporter by name."""
    out: dict[str, Exporter] = {}
    for module, cls in _BUILTIN:
        exp = getattr(importlib.import_module(module), cls)()
        out[exp.name] = exp
    return out


def get_exporter(name: str) -> Exporter:
    """The exporter called ``name``; unknown names raise a SpecError with close matches."""
    table = exporters()
    if name not in table:
        raise unknown_name("exporter", name, table)
    return table[name]


def resolve_format(exporter: Exporter, fmt: str) -> str:
    """The output format to use: ``fmt`` if the exporter has it, its default if ``fmt`` is empty."""
    if not fmt:
        return exporter.formats[0]
    if fmt not in exporter.formats:
        raise SpecError("--format", fmt, f"{exporter.name} writes {', '.join(exporter.formats)}")
    return fmt


def comment_block(lines: list[str] | tuple[str, ...], prefix: str = "# ") -> str:
    """Lines as comments (one comment line per input line; empty lines stay bare comment markers)."""
    return "\n".join((prefix + ln).rstrip() for ln in lines)


def header_lines(*, framework: str, target: str, model: ModelSpec, plan: Plan, gpus: str,
                 approximations: tuple[str, ...]) -> list[str]:
    """The comment header every export starts with: what it is for, the release it targets, what it
    approximates."""
    lines = [f"meshplan export for {framework}", f"target: {target}",
             f"model: {model.name} ({model.n_layers} layers); gpus: {gpus or plan.n_gpus}",
             "plan: " + ", ".join(f"{k}={v}" for k, v in plan.to_dict().items())]
    if approximations:
        lines.append(f"APPROXIMATE: {framework} cannot express {len(approximations)} part(s) of the plan:")
        lines += [f"  - {a}" for a in approximations]
    else:
        lines.append(f"exact: {framework} expresses every part of the plan")
    return lines


def refusals(plan: Plan, exporter: Exporter) -> list[str]:
    """Why the exporter's framework would not start the plan at all: a ZeRO stage above what its stacks combine
    with pipeline parallelism (DeepSpeed's PipelineEngine asserts stage < 2: deepspeed/runtime/pipe/engine.py,
    "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"; Megatron-DeepSpeed's --no-pipeline-parallel
    needs pp = 1, megatron/arguments.py)."""
    top = max(catalog.framework(s).max_zero_with_pp for s in exporter.stacks)
    syncs = {m for s in exporter.stacks for m in catalog.framework(s).dp_syncs}
    if plan.dp * plan.cp > 1 and plan.sync not in syncs:
        return [f"dp_sync={plan.sync}: {exporter.name} synchronises gradients with {', '.join(sorted(syncs))} only; "
                "a parameter-server plan runs under BytePS (its launcher, not this export)"]
    if plan.pp > 1 and plan.zero > top:
        return [f"ZeRO-{plan.zero} with pp={plan.pp}: {exporter.name} combines pipeline parallelism with ZeRO-{top} "
                f"at most; re-plan with --zero {top} or --pp 1"]
    return []


def stack_gaps(plan: Plan, exporter: Exporter, stack: FrameworkProfile) -> list[str]:
    """Settings of the plan's stack that none of the exporter's stacks can run, flagged instead of dropped."""
    profiles = [catalog.framework(s) for s in exporter.stacks]
    if stack.tp_comm_overlap and plan.tp > 1 and not any(p.tp_comm_overlap_supported for p in profiles):
        return [f"TP communication overlap (tp_comm_overlap): {exporter.name}'s stacks "
                f"({', '.join(exporter.stacks)}) cannot overlap TP collectives with GEMMs; exported without it"]
    return []


def plan_wide_approximations(plan: Plan, exporter: Exporter) -> tuple[str, ...]:
    """Parts of a plan no supported framework expresses, whatever the exporter, and a stack that is not the one
    the exported framework runs (its prediction was made for other software)."""
    out = []
    if plan.batch_shares:
        out.append(f"uneven data-parallel batch shares per GPU pool {list(plan.batch_shares)}: the frameworks split "
                   "the global batch evenly over data-parallel ranks")
    if plan.extra_state_copies:
        out.append(f"state_copies={plan.state_copies}: peer copies of the optimizer state are meshplan's; the "
                   "frameworks keep none (NVRx local checkpoints or torchft replica groups come closest)")
    if plan.framework not in exporter.stacks:
        out.append(f"the plan was predicted for the {plan.framework} stack; {exporter.name} runs it as "
                   f"{exporter.stacks[0]} (kernels, sharding and overlap differ): re-predict with --framework "
                   f"{exporter.stacks[0]}")
    return tuple(out)


def render_export(exporter: Exporter, model: ModelSpec, plan: Plan, stack: FrameworkProfile, *, gpus: str = "",
                  fmt: str = "") -> ExportResult:
    """Render with ``exporter`` and add the plan-wide approximations (as comments and in the result); raise
    ExportError when the framework would refuse the plan."""
    refused = refusals(plan, exporter)
    if refused:
        raise ExportError("; ".join(refused))
    result = exporter.render(model, plan, stack, gpus=gpus, fmt=fmt)
    extra = plan_wide_approximations(plan, exporter) + tuple(stack_gaps(plan, exporter, stack))
    if not extra:
        return result
    prefix = "// " if fmt == "json" else "# "
    block = comment_block([f"APPROXIMATE: {x}" for x in extra], prefix=prefix) + "\n"
    # after a shebang, which only works on the first line
    shebang, rest = result.text.split("\n", 1) if result.text.startswith("#!") else ("", result.text)
    text = (shebang + "\n" if shebang else "") + block + rest
    return ExportResult(text=text, approximations=tuple(result.approximations) + extra)
