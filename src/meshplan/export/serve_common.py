"""Pieces every serving export shares: the job being exported, where its GPUs and ports are, the context length and
prompt count it is launched and measured with, and how commands are written into a shell script.

The engine-specific exporters (``serve_vllm``, ``serve_sglang``, ``serve_trtllm``, ``serve_tgi``,
``serve_lmdeploy``) turn a ``ServeJob`` into engine
commands; this module knows nothing of any engine's flags.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, fields

from meshplan import catalog
from meshplan.export.base import ExportError
from meshplan.spec.engine import CLOSED_LOOP_ROUNDS, EngineProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.serving import ServePlan, Workload

GPUS_PER_NODE = 8
"""Default GPUs one launch command can see (the cluster's ``gpus_per_node`` is passed when known): the 8-GPU
HGX/DGX boards the catalog's serving GPUs come on (NVIDIA HGX H100/H200/B200 are 8-GPU baseboards)."""

CONTEXT_ROUND = 1024
"""The context length a server is started with is the request's prompt plus output rounded up to this many tokens
(a round number of whole KV blocks for every block size the engines accept: 1 to 128)."""

HOST = "127.0.0.1"
"""Address the benchmark and routers reach the servers on (one node; multi-node launches say where to change it)."""


@dataclass(frozen=True, kw_only=True)
class Pool:
    """The replicas of one role: all of a colocated deployment, or the prefill or the decode side of a
    disaggregated one."""

    role: str
    """``serve`` (prefill and decode together), ``prefill`` or ``decode``."""
    plan: ServePlan
    """Layout of each replica of the pool."""
    replicas: int
    """Engine instances in the pool."""
    gpus_per_node: int = GPUS_PER_NODE
    """GPUs of one node of the cluster the pool runs on."""

    @property
    def n_gpus(self) -> int:
        """GPUs of the pool."""
        return self.plan.gpus_per_replica * self.replicas


@dataclass(frozen=True, kw_only=True)
class ServeJob:
    """Everything one export needs, passed as one value."""

    model: ModelSpec
    """The model (its name, MoE-ness and trained context)."""
    model_ref: str
    """What the engine loads: a Hugging Face id or a checkpoint path, written verbatim into the commands."""
    plan: ServePlan
    """The deployment as planned (for a disaggregated one, the plan the caller predicted with)."""
    engine: EngineProfile
    """The engine profile the plan was predicted for."""
    work: Workload
    """The load the plan was made for; the benchmark reproduces it."""
    pools: tuple[Pool, ...]
    """One ``serve`` pool, or a ``prefill`` and a ``decode`` pool."""
    gpus_per_node: int = GPUS_PER_NODE
    """GPUs of one node of the cluster."""

    @property
    def disaggregated(self) -> bool:
        """Prefill and decode run in separate pools."""
        return any(p.role != "serve" for p in self.pools)


@dataclass(frozen=True, kw_only=True)
class Launch:
    """One process to start."""

    role: str
    """What it is, for the comment above it (``replica 1``, ``prefill 0``, ``router``)."""
    argv: tuple[str, ...]
    """The command line, program first."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment set on the command (``CUDA_VISIBLE_DEVICES``...)."""
    node: int = 0
    """Node the command runs on (0 = the first)."""


def make_job(*, model: ModelSpec, model_ref: str, plan: ServePlan, engine: EngineProfile, work: Workload,
             disagg: dict | None, gpus_per_node: int = GPUS_PER_NODE) -> ServeJob:
    """The job, with its pools laid out: ``disagg`` is ``{"prefill": ServePlan, "decode": ServePlan,
    "prefill_replicas": int, "decode_replicas": int}`` or None."""
    if not model_ref.strip():
        raise ExportError("the model reference (a Hugging Face id or a checkpoint path) is empty")
    if disagg is None:
        pools = (Pool(role="serve", plan=plan, replicas=plan.replicas, gpus_per_node=gpus_per_node),)
    else:
        missing = sorted({"prefill", "decode", "prefill_replicas", "decode_replicas"} - set(disagg))
        if missing:
            raise ExportError(f"disaggregated export needs {', '.join(missing)}")
        prefill = Pool(role="prefill", plan=disagg["prefill"], replicas=int(disagg["prefill_replicas"]),
                       gpus_per_node=gpus_per_node)
        decode = Pool(role="decode", plan=disagg["decode"], replicas=int(disagg["decode_replicas"]),
                      gpus_per_node=gpus_per_node)
        if prefill.replicas < 1 or decode.replicas < 1:
            raise ExportError("a disaggregated deployment needs at least one prefill and one decode replica")
        pools = (prefill, decode)
    return ServeJob(model=model, model_ref=model_ref, plan=plan, engine=engine, work=work, pools=pools,
                    gpus_per_node=gpus_per_node)


def profile_refusals(job: ServeJob) -> None:
    """Refuse what the engine profile says the engine cannot run (``max_pp``, ``disaggregation``), citing the
    profile's source for it: one place for every exporter, read from the same fields the search obeys."""
    e = job.engine
    if job.disaggregated and not e.disaggregation:
        raise ExportError(f"engine profile {e.name} has no disaggregated mode: "
                          f"{e.sources.get('disaggregation', 'prefill and decode run in one engine')}")
    for pool in job.pools:
        where = "" if pool.role == "serve" else f"{pool.role}: "
        p = pool.plan
        if p.attn_dp > 1 and not e.attention_dp:
            raise ExportError(f"{where}attn_dp={p.attn_dp}: engine profile {e.name} runs no data-parallel attention")
        if p.attn_dp > 1 and e.attention_dp_tp and p.tp > e.attention_dp_tp:
            raise ExportError(f"{where}attn_dp={p.attn_dp} with tp={p.tp}: {e.name}'s data-parallel attention runs "
                              f"tp <= {e.attention_dp_tp} per group: {e.sources.get('attention_dp_tp', '')}")
        if e.max_pp and pool.plan.pp > e.max_pp:
            raise ExportError(f"{where}pp={pool.plan.pp}: engine profile {e.name} has no pipeline parallelism beyond "
                              f"{e.max_pp} stage(s): {e.sources.get('max_pp', 'no pipeline degree')}")


def placements(job: ServeJob) -> dict[str, list[tuple[int, list[int]]]]:
    """Where each replica runs, pool by pool: (node, node-local GPU indices). Replicas are packed node by node in
    pool order; one that would straddle two nodes starts on the next, and one larger than a node takes whole nodes
    (its list then names one node's GPUs, the same on each)."""
    node, local, out = 0, 0, {}
    per_node = job.gpus_per_node
    for pool in job.pools:
        g, spots = pool.plan.gpus_per_replica, []
        for _ in range(pool.replicas):
            if local and (g >= per_node or local + g > per_node):
                node, local = node + 1, 0
            if g >= per_node:
                spots.append((node, list(range(per_node))))
                node += math.ceil(g / per_node)
                continue
            spots.append((node, list(range(local, local + g))))
            local += g
        out[pool.role] = spots
    return out


def replica_nodes(pool: Pool) -> int:
    """Nodes one replica of ``pool`` spans (1 unless it has more GPUs than a node)."""
    return max(1, math.ceil(pool.plan.gpus_per_replica / pool.gpus_per_node))


def visible_devices(gpus: list[int]) -> tuple[str, str]:
    """The ``CUDA_VISIBLE_DEVICES`` setting for node-local GPUs."""
    return ("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in gpus))


def port_span(first: int, count: int) -> str:
    """``8001-8004`` for four ports from 8001, ``8100`` for one."""
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def replica_launches(job: ServeJob, *, port: int, argv, balancer: str) -> tuple[list[Launch], list[str]]:
    """One server per replica of the aggregated pool on its GPUs, ``argv(replica, port)`` its command: on ``port``
    alone, or on the ports after it behind a round-robin load balancer on ``port`` (``balancer`` names the engine's
    own, if any), for engines with no data parallelism of their own."""
    pool = job.pools[0]
    ports = [port] if pool.replicas == 1 else [port + 1 + i for i in range(pool.replicas)]
    launches = [Launch(role=f"replica {i}", argv=tuple(argv(i, p)), env=(visible_devices(gpus),), node=node)
                for i, ((node, gpus), p) in enumerate(zip(placements(job)["serve"], ports))]
    notes = []
    if pool.replicas > 1:
        notes.append(f"{pool.replicas} replicas on ports {port_span(ports[0], len(ports))}: put a round-robin load "
                     f"balancer on port {port} in front of them ({balancer})")
    return launches, notes


def fits_one_node(job: ServeJob) -> bool:
    """Every GPU of the deployment is on one node (an engine's own data-parallel flag then starts all replicas)."""
    return sum(p.n_gpus for p in job.pools) <= job.gpus_per_node


def context_len(job: ServeJob) -> int:
    """Longest sequence the server admits: prompt plus output (tokens) rounded up to ``CONTEXT_ROUND``, never past
    the model's trained context; a request longer than that context cannot be served at all."""
    need = job.work.input_len + job.work.output_len
    trained = job.model.max_seq_len
    if trained and need > trained:
        raise ExportError(f"{job.work.input_len}+{job.work.output_len} tokens per request exceed {job.model.name}'s "
                          f"trained context of {trained}: no engine starts with a longer max length")
    cap = job.engine.max_context
    if cap and need > cap:
        why = job.engine.sources.get("max_context", "max_context")
        raise ExportError(f"{job.work.input_len}+{job.work.output_len} tokens per request exceed the {cap} one "
                          f"sequence of engine profile {job.engine.name} holds: {why}")
    rounded = -(-need // CONTEXT_ROUND) * CONTEXT_ROUND
    limit = min(x for x in (trained, cap) if x) if (trained or cap) else 0
    return min(rounded, limit) if limit else rounded


def num_prompts(work: Workload) -> int:
    """Requests one benchmark run sends: 10 per client of a closed loop (each client's first request meets an empty
    server, so ten rounds make the steady state dominate), one minute of arrivals of an open loop (at least 100),
    and the benchmark clients' own default of 1000 offline (vllm bench serve and sglang.bench_serving
    ``--num-prompts`` default 1000)."""
    if work.concurrency:
        return CLOSED_LOOP_ROUNDS * work.concurrency
    if work.rate:
        return max(100, math.ceil(60 * work.rate))
    return 1000


def changed_settings(engine: EngineProfile) -> set[str]:
    """Settings of ``engine`` that differ from its catalog preset of the same name (all of them when it is not a
    catalog profile): those are what an engine without the matching flag cannot be told."""
    names = [f.name for f in fields(EngineProfile) if f.name not in ("name", "engine", "version", "summary",
                                                                       "matches", "sources")]
    if engine.name not in catalog.engine_names():
        return set(names)
    base = catalog.engine(engine.name)
    return {n for n in names if getattr(engine, n) != getattr(base, n)}


def version_key(version: str) -> tuple[int, ...] | None:
    """``"0.11.0"`` -> ``(0, 11, 0)``; None when the version is not a plain dotted release number."""
    parts = version.strip().lstrip("v").split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def pick_release(engine: EngineProfile, releases: dict[str, object]) -> tuple[str, object, list[str]]:
    """The newest release in ``releases`` (version -> facts) not newer than the profile's version, and a note when
    it is not the same major.minor (its flag spellings stand in for the profile's)."""
    want = version_key(engine.version)
    if want is None:
        raise ExportError(f"engine profile {engine.name} has version {engine.version!r}, not a release number: "
                          f"no {engine.engine} launch to export")
    known = sorted((version_key(v), v) for v in releases)
    older = [(k, v) for k, v in known if k <= want]
    if not older:
        raise ExportError(f"{engine.engine} {engine.version} predates the oldest release meshplan exports to "
                          f"({known[0][1]})")
    key, name = older[-1]
    notes = [] if key[:2] == want[:2] else [
        f"{engine.engine} {engine.version}: written with the flags of {engine.engine} {name}, the closest older "
        "release meshplan knows; check them against the installed version's --help"]
    return name, releases[name], notes


def command_lines(launch: Launch, *, background: bool = False) -> list[str]:
    """A command as shell lines: environment and program (with ``-m module`` and positional arguments) on the
    first, one option with its values per line after it."""
    groups: list[list[str]] = [[]]
    for i, raw in enumerate(launch.argv):
        is_option = raw.startswith("--") or (raw.startswith("-") and len(raw) > 1 and not _is_number(raw))
        if is_option and groups[-1] and not (raw == "-m" and i == 1):
            groups.append([])
        groups[-1].append(shlex.quote(raw))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in launch.env)
    lines = [(env + " " if env else "") + " ".join(groups[0])] + ["    " + " ".join(g) for g in groups[1:]]
    return [ln + " \\" for ln in lines[:-1]] + [lines[-1] + (" &" if background else "")]


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def script(*, header: list[str], launches: list[Launch], notes: list[str] = ()) -> str:
    """A bash script: the comment header, notes, then each launch under a comment naming it (and its node when not
    the first); several launches run in the background and the script waits for them."""
    out = ["#!/usr/bin/env bash", *[("# " + h).rstrip() for h in header], "set -euo pipefail", ""]
    out += [f"# {note}" for note in notes]
    several = len(launches) > 1
    for launch in launches:
        where = f" (on node {launch.node})" if launch.node else ""
        out.append(f"# {launch.role}{where}")
        out += command_lines(launch, background=several)
        out.append("")
    if several:
        out.append("wait")
    return "\n".join(out).rstrip("\n") + "\n"


def header(*, job: ServeJob, target: str, what: str, approximations: list[str]) -> list[str]:
    """The comment lines every exported file starts with: that meshplan generated it, for which release, from
    which plan and load, and what the engine cannot express."""
    w = job.work
    loop = (f"closed loop of {w.concurrency} clients" if w.concurrency else
            f"open loop of {w.rate:g} requests/s" if w.rate else "offline (every request queued at once)")
    lines = [f"{what}, generated by meshplan", f"target: {target}",
             f"model: {job.model.name} (loaded as {job.model_ref}); engine profile: {job.engine.name}"]
    for pool in job.pools:
        p = pool.plan
        adp = f" attn_dp={p.attn_dp}" if p.attn_dp > 1 else ""
        lines.append(f"{pool.role}: {pool.replicas} x (tp={p.tp}{adp} pp={p.pp} ep={p.ep}), {p.precision} weights, "
                     f"{p.kv_dtype} KV, {pool.n_gpus} GPUs")
    lines.append(f"workload: {w.input_len} prompt + {w.output_len} output tokens, {loop}")
    if approximations:
        lines.append(f"APPROXIMATE: the engine cannot express {len(approximations)} part(s) of the plan:")
        lines += [f"  - {a}" for a in approximations]
    else:
        lines.append("exact: the engine expresses every part of the plan")
    return lines


def to_yaml(value, indent: int = 0) -> list[str]:
    """Block-style YAML of nested dicts of scalars and flat lists (all these option files hold)."""
    out, pad = [], " " * indent
    for key, v in value.items():
        if isinstance(v, dict):
            out += [f"{pad}{key}:", *to_yaml(v, indent + 2)]
        else:
            out.append(f"{pad}{key}: {_scalar(v)}")
    return out


def _scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):  # strings quoted: a flow list item may not hold ", [ ] #" bare
        return "[" + ", ".join(json.dumps(x) if isinstance(x, str) else _scalar(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, str) and (":" in v or _is_number(v)):  # quoted: a number-like string stays a string
        return json.dumps(v)
    return str(v)


FP4_CHECKPOINT = ("fp4 weights: MODEL must be an NVFP4-quantized checkpoint (NVIDIA ModelOpt, hf_quant_config.json), "
                  "whose quantization config the engine reads; it does not quantize to fp4 online")
"""What an fp4 plan needs of the checkpoint it loads."""
INT4_CHECKPOINT = ("int4 weights: MODEL must be a 4-bit weight-only checkpoint (AWQ or GPTQ, group 128), whose "
                   "quantization config the engine reads; it does not quantize online")
"""What an int4 plan needs of the checkpoint it loads."""


def checkpoint_notes(precision: str) -> list[str]:
    """What the checkpoint of a quantized plan must be (``FP4_CHECKPOINT``, ``INT4_CHECKPOINT``), else nothing."""
    return {"fp4": [FP4_CHECKPOINT], "int4": [INT4_CHECKPOINT]}.get(precision, [])
