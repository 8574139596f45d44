"""Serving exports: a ``ServePlan`` as the launch commands of a serving engine, plus the benchmark that measures
the load it was planned for.

One exporter per engine family, in one registry (``EXPORTERS``): vLLM (``serve_vllm``), SGLang (``serve_sglang``),
TensorRT-LLM (``serve_trtllm``), Hugging Face TGI (``serve_tgi``), LMDeploy (``serve_lmdeploy``). Each writes
``launch.sh`` (one command per replica, or the engine's own data-parallel flag; prefill and decode servers and
their router when disaggregated), the option files its engine reads (TensorRT-LLM's ``extra_llm_api_options.yaml``)
and ``bench.sh``, using the flag spelling of the profile's release. What the release cannot express is listed in
``ServeExport.approximations`` (and in each file's header);
a plan it cannot start at all raises ``ExportError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshplan.export import serve_lmdeploy, serve_sglang, serve_tgi, serve_trtllm, serve_vllm
from meshplan.export.base import ExportError
from meshplan.export.serve_common import ServeJob, make_job, profile_refusals
from meshplan.spec.engine import EngineProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.serving import ServePlan, Workload

EXPORTERS: dict[str, Callable[[ServeJob], tuple[dict[str, str], list[str]]]] = {
    "vllm": serve_vllm.export,
    "sglang": serve_sglang.export,
    "trtllm": serve_trtllm.export,
    "tgi": serve_tgi.export,
    "lmdeploy": serve_lmdeploy.export,
}
"""Engine family -> exporter; adding an engine is a module and a line here."""


@dataclass(frozen=True, kw_only=True)
class ServeExport:
    """What a serving export produced."""

    files: dict[str, str]
    """File name -> text (``launch.sh``, ``bench.sh``, option files the launch reads)."""
    approximations: tuple[str, ...] = ()
    """One sentence per part of the plan or profile the engine release cannot express."""

    @property
    def exact(self) -> bool:
        """The engine expresses the whole plan."""
        return not self.approximations


def export_serving(*, model: ModelSpec, model_ref: str, plan: ServePlan, engine: EngineProfile, work: Workload,
                   disagg: dict | None = None, gpus_per_node: int = 8) -> ServeExport:
    """Export ``plan`` (served with ``engine``, loading ``model_ref``) as launch and benchmark scripts.

    Args:
        model: the served model.
        model_ref: what the engine loads, verbatim: a Hugging Face id (``meta-llama/Llama-3.1-70B-Instruct``) or a
            checkpoint path; the catalog names models, not checkpoints.
        plan: the deployment (tp, pp, ep, replicas, precision, KV dtype).
        engine: the engine profile the plan was predicted with; its family picks the exporter, its version the
            flag spelling.
        work: the load; ``bench.sh`` reproduces it (prompt and output tokens, closed loop, open loop or offline).
        disagg: for prefill/decode disaggregation, ``{"prefill": ServePlan, "decode": ServePlan,
            "prefill_replicas": int, "decode_replicas": int}``.
        gpus_per_node: GPUs one node of the cluster has (how replicas are placed and when one spans nodes).

    Raises:
        ExportError: the engine release cannot launch the plan (e.g. pp > 1 on an SGLang without pipeline
            parallelism, disaggregation on a release without it, a request longer than the model's context).
    """
    if engine.engine not in EXPORTERS:
        raise ExportError(f"no serving export for engine family {engine.engine!r} (profile {engine.name}); "
                          f"exports exist for {', '.join(EXPORTERS)}")
    job = make_job(model=model, model_ref=model_ref, plan=plan, engine=engine, work=work, disagg=disagg,
                   gpus_per_node=gpus_per_node)
    profile_refusals(job)
    files, approximations = EXPORTERS[engine.engine](job)
    return ServeExport(files=files, approximations=tuple(approximations))
