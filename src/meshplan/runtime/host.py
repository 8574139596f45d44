"""Pre-flight: can this host hold a run? Checked before any process starts, without torch.

A run that cannot fit is refused with both numbers (what it needs, what the host has). The rules, and where
their numbers come from:

* **Processes per core** (CPU runs): at most ``max(8, 4 x usable cores)`` ranks. gloo ranks on a CPU
  oversubscribe the cores; the suite's 8-rank layouts (tp2 x pp2 x dp2 ...) finish well inside their 30 s
  process-group timeout on a 2-core host, while 64 ranks on 2 cores (a quarter of a core is the least any rank
  got in the suite, 1/32 here) spend their time descheduled in collectives. Usable cores are the affinity mask
  (``os.sched_getaffinity``), not the machine's.
* **GPUs** (when torch sees CUDA devices, the runtime puts one rank on each): at most one rank per visible GPU;
  ``check --device cuda`` needs one.
* **Host memory**: ranks x per-rank bytes (``rank_host_bytes``) must stay under ``MEMORY_FRACTION`` of
  what the host can still give: ``MemAvailable`` of /proc/meminfo, or less under a cgroup memory limit.
* **GPU memory** (where ``nvidia-smi`` answers): the cost model's peak of the busiest rank (the meshplan stack's
  prediction ``meshplan memcheck`` holds within 5 % of the runtime) against each GPU's free memory.

What the CPU runtime allocates is not what the cost model predicts for a GPU: it builds each pipeline stage whole
in fp32 before sharding it, computes in fp32, and its foreach AdamW makes a temporary the size of the weights
(``rank_host_bytes``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from meshplan import catalog
from meshplan.errors import MeshplanError
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

GiB = 2**30

RANKS_PER_CORE = 4
MIN_RANK_BOUND = 8
"""CPU runs: at most max(MIN_RANK_BOUND, RANKS_PER_CORE x usable cores) ranks (see the module docstring)."""

MEMORY_FRACTION = 0.9
"""Share of the available host memory a run may plan to use; the rest is for the page cache and other tenants."""

CPU_RANK_BASE = 0.45 * GiB
"""Resident memory of a CPU rank before the model: Python, torch 2.13's CPU wheel and gloo (measured: 400 MiB
VmHWM per tiny-llama worker, 2 ranks on this 2-core host), rounded up."""

CUDA_RANK_BASE = 2.0 * GiB
"""Host memory of a CUDA rank before the model: the CUDA libraries and pinned pools (not measured here: CUDA
processes of torch 2.x hold 1-3 GiB of host memory; the middle is taken)."""

HEADROOM = 1.1
"""Factor on the model-dependent part of a CPU rank's estimate: what the allocator keeps mapped varies from run to
run, and without it the estimate came within 1 % of measured ZeRO-3 peaks (``rank_host_bytes``)."""

AGENT_BYTES = 0.25 * GiB
"""The torchrun agent and meshplan itself (measured: 223 MiB VmHWM for torchrun)."""


class HostLimit(MeshplanError):
    """The run asks for more than this host has; the message names both."""


@dataclass(frozen=True, kw_only=True)
class Host:
    """What this machine offers a run."""

    cores: int
    """CPU cores this process may run on."""
    memory: float
    """Host memory still available (bytes)."""
    gpus: int
    """CUDA devices torch sees (0 without CUDA or without torch)."""
    gpu_free: tuple[float, ...] = ()
    """Free memory of each visible GPU (bytes), empty when nvidia-smi cannot tell."""

    @property
    def device(self) -> str:
        """Where the runtime puts its ranks: ``cuda`` when a GPU is visible, else ``cpu``."""
        return "cuda" if self.gpus else "cpu"


def available_memory() -> float:
    """Bytes the host can still give: MemAvailable, capped by the cgroup's limit minus its usage."""
    avail = float("inf")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = float(f.read().strip())
        if limit != "max":
            avail = min(avail, float(limit) - used)
    except (OSError, ValueError):
        pass
    return avail


def usable_cores() -> int:
    """Cores of this process's affinity mask."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def visible_gpus() -> int:
    """CUDA devices torch sees (what ``runtime.mesh.device_for`` uses); 0 without torch."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_free_bytes(n: int) -> tuple[float, ...]:
    """Free memory of the first ``n`` visible GPUs from nvidia-smi (CUDA_VISIBLE_DEVICES honoured when it lists
    indices), or () when it cannot be asked."""
    if not n or shutil.which("nvidia-smi") is None:
        return ()
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True).stdout
        free = [float(x) * 2**20 for x in text.split()]
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if vis and all(v.strip().isdigit() for v in vis.split(",")):
        free = [free[int(v)] for v in vis.split(",") if int(v) < len(free)]
    return tuple(free[:n])


def probe_host() -> Host:
    """This machine, now."""
    gpus = visible_gpus()
    return Host(cores=usable_cores(), memory=available_memory(), gpus=gpus, gpu_free=gpu_free_bytes(gpus))


# ------------------------------------------------------------------------------------------- per-rank bytes
def stage_params(spec: ModelSpec, plan: Plan) -> list[float]:
    """Parameters of each virtual stage as the runtime builds it, whole (every expert, no tp shard): its layers,
    the input embedding on the first stage, the output head (or a tied embedding's copy) on the last."""
    from meshplan.cost.memory import layer_params
    from meshplan.spec.checks import layer_split

    flat, out, i = list(spec.layers()), [], 0
    split = layer_split(spec, plan)
    for s, n in enumerate(split):
        count = sum(sum(layer_params(b.layer)) for b, _ in flat[i:i + n])
        i += n
        first, last = s == 0, s == len(split) - 1
        emb = spec.vocab * spec.hidden
        count += emb * first + emb * (last and not (first and spec.tied_embeddings))
        out.append(float(count))
    return out


def rank_stage_params(spec: ModelSpec, plan: Plan) -> list[float]:
    """Whole-stage parameters each pipeline rank builds (the sum of its stages)."""
    from meshplan.spec.schedules import is_csv, rank_stages

    per_stage = stage_params(spec, plan)
    if plan.pp == 1:
        return [sum(per_stage)]
    if is_csv(plan.schedule_name):  # the CSV's placement is only known to torch's loader: assume the largest
        return [max(per_stage) * plan.n_stages / plan.pp] * plan.pp
    placement = rank_stages(plan.schedule_name, pp=plan.pp, n_stages=plan.n_stages)
    return [sum(per_stage[s] for s in stages) for stages in placement]


def _estimate(spec: ModelSpec, plan: Plan, stack):
    from meshplan.cost.estimate import estimate

    return estimate(spec, catalog.cluster(f"{plan.n_gpus}xcpu"), plan.with_(framework=stack.name), stack=stack)


def rank_host_bytes(spec: ModelSpec, plan: Plan, stack) -> float:
    """Peak resident bytes of the busiest CPU rank of ``plan``: the process base, its stages built whole in fp32
    (the runtime initialises a stage before sharding it, and the allocator keeps most of it mapped), and the cost
    model's fp32 tensors with the activations counted at 4 bytes (the model counts 16-bit ones) and foreach
    AdamW's temporary (a copy of the rank's weights, ``_foreach_sqrt`` of the second moments).

    Measured VmHWM of the busier of 2 ranks vs this estimate, GiB (a 112 M-parameter Llama: 4 layers, hidden
    1024, vocab 32000; 512 tokens per rank and micro-batch unless said): dp2 ZeRO-3 2.19 / 2.38, dp2 replicated
    2.84 / 3.31, dp2 ZeRO-3 with 4096 tokens 4.37 / 4.79, tp2 (1024) 1.76 / 2.31, pp2 1f1b (256) 1.71 / 1.98:
    the model-dependent part without HEADROOM came within 1 % of the ZeRO-3 peaks.
    """
    fp32 = _estimate(spec, plan.with_(precision="fp32"), stack)
    built = rank_stage_params(spec, plan)
    return CPU_RANK_BASE + HEADROOM * max(4.0 * b + m.total() - m.reserved + m.activations + m.params
                                          for b, m in zip(built, fp32.memory_per_stage))


def rank_gpu_bytes(spec: ModelSpec, plan: Plan, stack) -> float:
    """Peak bytes of the busiest GPU rank: the cost model's prediction for the meshplan stack (what memcheck
    holds within 5 % of the runtime), with a GPU's reserve. Memory does not depend on the GPU model beyond that
    reserve, so the CPU cluster of the same size (which every runtime plan passes) is the one estimated."""
    from meshplan.cost.memory import reserved_bytes

    est = _estimate(spec, plan, stack)
    return max(m.total() - m.reserved for m in est.memory_per_stage) + reserved_bytes("gpu")


def rank_build_bytes(spec: ModelSpec, plan: Plan) -> float:
    """Host bytes a GPU rank needs while it builds: its stages whole in fp32 (moved to the GPU afterwards)."""
    return 4.0 * max(rank_stage_params(spec, plan))


# ------------------------------------------------------------------------------------------------ verdict
def check_ranks(nproc: int, host: Host, what: str) -> None:
    """Raise HostLimit when ``nproc`` ranks exceed the visible GPUs, or on a CPU the rank bound."""
    if host.device == "cuda":
        if nproc > host.gpus:
            raise HostLimit(f"{what}: {nproc} ranks need {nproc} GPUs (one each), this host has {host.gpus} "
                            f"visible")
        return
    bound = max(MIN_RANK_BOUND, RANKS_PER_CORE * host.cores)
    if nproc > bound:
        raise HostLimit(f"{what}: {nproc} CPU ranks on {host.cores} usable core{'s' * (host.cores != 1)}; this host "
                        f"runs at most {bound} ({RANKS_PER_CORE} per core, at least {MIN_RANK_BOUND}): use at most "
                        f"{bound} processes (a plan for --gpus {bound}xcpu), or a host where {nproc} GPUs are "
                        "visible")


def preflight(spec: ModelSpec, plans: list[Plan], stack, *, nproc: int, host: Host, what: str = "run",
              together: bool = True) -> str:
    """Raise HostLimit when ``nproc`` ranks of ``plans`` cannot run on ``host``; else return a one-line summary
    of what they will use. ``together``: every plan's trainer lives at once (a CPU check builds all first),
    else one at a time (a GPU check)."""
    join = sum if together else max
    if host.device == "cpu":
        per_rank = CPU_RANK_BASE + join(rank_host_bytes(spec, p, stack) - CPU_RANK_BASE for p in plans)
        detail, gpu = "fp32, each stage built whole before sharding", None
        if together and len(plans) > 1:
            detail += f"; all {len(plans)} plans' trainers at once"
    else:
        per_rank = CUDA_RANK_BASE + join(rank_build_bytes(spec, p) for p in plans)
        detail, gpu = "its stages built whole in fp32 before moving to the GPU", max(
            rank_gpu_bytes(spec, p, stack) for p in plans)
    need = nproc * per_rank + AGENT_BYTES
    if need > MEMORY_FRACTION * host.memory:
        raise HostLimit(f"{what}: needs ~{need / GiB:,.1f} GiB of host memory ({nproc} rank{'s' * (nproc != 1)} x "
                        f"{per_rank / GiB:,.2f} GiB: {detail}), this host has {host.memory / GiB:,.1f} GiB "
                        f"available (MemAvailable; a run may plan {MEMORY_FRACTION:.0%} of it)")
    check_ranks(nproc, host, what)
    line = f"{nproc} rank{'s' * (nproc != 1)} on {host.device}: ~{need / GiB:,.1f} GiB of {host.memory / GiB:,.1f} " \
        "GiB host memory available"
    if gpu is not None:
        free = min(host.gpu_free[:nproc]) if host.gpu_free else None
        if free is not None and gpu > free:
            raise HostLimit(f"{what}: needs ~{gpu / GiB:,.1f} GiB per GPU (the cost model's peak of the busiest "
                            f"rank), the fullest visible GPU has {free / GiB:,.1f} GiB free")
        line += f", ~{gpu / GiB:,.1f} GiB per GPU" + (f" of {free / GiB:,.1f} free" if free is not None else
                                                       " (free GPU memory unknown: no nvidia-smi)")
    return line


def device_note(gpus_ref: str | None, host: Host) -> str | None:
    """A note when the plan was made for another kind of device than the runtime will use here, else None."""
    if not gpus_ref:
        return None
    try:
        kinds = {p.gpu.generation for p in catalog.cluster(gpus_ref).pools}
    except MeshplanError:
        return None
    if host.device == "cpu" and kinds != {"cpu"}:
        return (f"note: the plan was made for {gpus_ref}; this host has no visible GPU, so its ranks run on the "
                "CPU (gloo, fp32)")
    if host.device == "cuda" and kinds == {"cpu"}:
        return f"note: the plan was made for {gpus_ref}; this host has GPUs, so its ranks run on them (NCCL)"
    return None


class TorchMissing(MeshplanError):
    """PyTorch is not installed (``make demo`` installs meshplan without its runtime extra)."""


def require_torch(command: str) -> None:
    """Raise TorchMissing, with the install command, when torch cannot be imported."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise TorchMissing(f"{command} needs PyTorch, which cannot be imported here ({exc}); install the runtime "
                           "extra: pip install -e '.[runtime]' in the meshplan checkout (make test pins "
                           "torch==2.13.0)") from None
