"""The exporter protocol and its registry: one module per framework, looked up by name.

An exporter turns (model, plan, stack profile) into the text a framework reads. Whatever the framework cannot
express is not dropped silently: it is listed in ``ExportResult.approximations`` (the CLI prints them on stderr,
writes them as comments into the file, and exits non-zero unless ``--allow-approximate``). Exporters never import
torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

from meshplan.errors import SpecError, unknown_name
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

# module path and class name of every built-in exporter; adding one is a module plus a line here
_BUILTIN = (
    ("meshplan.export.megatron", "MegatronExporter"),
    ("meshplan.export.torchtitan", "TorchtitanExporter"),
    ("meshplan.export.deepspeed", "DeepSpeedExporter"),
)


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


def header_lines(*, framework: str, model: ModelSpec, plan: Plan, gpus: str,
                 approximations: tuple[str, ...]) -> list[str]:
    """The comment header every export starts with: what it is for and what it approximates."""
    lines = [f"meshplan export for {framework}",
             f"model: {model.name} ({model.n_layers} layers); gpus: {gpus or plan.n_gpus}",
             "plan: " + ", ".join(f"{k}={v}" for k, v in plan.to_dict().items())]
    if approximations:
        lines.append(f"APPROXIMATE: {framework} cannot express {len(approximations)} part(s) of the plan:")
        lines += [f"  - {a}" for a in approximations]
    else:
        lines.append(f"exact: {framework} expresses every part of the plan")
    return lines


def plan_wide_approximations(plan: Plan, exporter: Exporter) -> tuple[str, ...]:
    """Parts of a plan no supported framework expresses, whatever the exporter, and a stack that is not the one
    the exported framework runs (its prediction was made for other software)."""
    out = []
    if plan.batch_shares:
        out.append(f"uneven data-parallel batch shares per GPU pool {list(plan.batch_shares)}: the frameworks split "
                   "the global batch evenly over data-parallel ranks")
    if plan.framework not in exporter.stacks:
        out.append(f"the plan was predicted for the {plan.framework} stack; {exporter.name} runs it as "
                   f"{exporter.stacks[0]} (kernels, sharding and overlap differ): re-predict with --framework "
                   f"{exporter.stacks[0]}")
    return tuple(out)


def render_export(exporter: Exporter, model: ModelSpec, plan: Plan, stack: FrameworkProfile, *, gpus: str = "",
                  fmt: str = "") -> ExportResult:
    """Render with ``exporter`` and add the plan-wide approximations (as comments and in the result)."""
    result = exporter.render(model, plan, stack, gpus=gpus, fmt=fmt)
    extra = plan_wide_approximations(plan, exporter)
    if not extra:
        return result
    prefix = "// " if fmt == "json" else "# "
    text = comment_block([f"APPROXIMATE: {x}" for x in extra], prefix=prefix) + "\n" + result.text
    return ExportResult(text=text, approximations=tuple(result.approximations) + extra)
