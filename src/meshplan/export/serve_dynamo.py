"""A disaggregated serving plan as an NVIDIA Dynamo deployment: one ``DynamoGraphDeployment`` (Kubernetes custom
resource of the Dynamo operator) with its frontend (HTTP, router) and the prefill and decode workers of the
plan, each worker the engine's own arguments behind Dynamo's wrapper module.

The shape follows ai-dynamo/dynamo@416ff06e (release 0.6.1) components/backends/{vllm,sglang,trtllm}/deploy/
disagg.yaml: ``spec.services`` with a ``Frontend`` (``componentType: frontend``) and workers
(``componentType: worker``, ``subComponentType: prefill|decode``), ``replicas``, ``resources.limits.gpu``,
``extraPodSpec.mainContainer`` (image, ``command: [python3, -m, dynamo.<engine>]``, ``args``). Dynamo moves the KV
cache itself (NIXL), so the workers get no connector settings. No Dynamo parser installs on a CPU machine without
its Rust runtime, so the file is checked against a golden copy of these documented names.
"""

from __future__ import annotations

from meshplan.export.serve_common import Pool, ServeJob, replica_nodes, to_yaml

DYNAMO_FILE = "dynamo_disagg.yaml"
"""The file a disaggregated export adds beside ``launch.sh``."""
VERSION = "0.6.1"
"""Dynamo release whose deployment schema and runtime images the file targets."""
WORKERS = {
    "vllm": ("vllm-runtime", "dynamo.vllm", "/workspace/components/backends/vllm"),
    "sglang": ("sglang-runtime", "dynamo.sglang", "/workspace/components/backends/sglang"),
    "trtllm": ("trtllm-runtime", "dynamo.trtllm", "/workspace/"),
}
"""Engine family -> (runtime image, worker module, working directory), as in each backend's disagg.yaml."""
IMAGE = "nvcr.io/nvidia/ai-dynamo/{image}:" + VERSION


def role_args(family: str, job: ServeJob, pool: Pool, engine_args: list[str]) -> list[str]:
    """A worker's arguments: the model, the engine's own options of the pool's layout, and the role switch
    each backend's wrapper takes (dynamo.vllm ``--is-prefill-worker``; dynamo.sglang SGLang's
    ``--disaggregation-mode`` with NIXL; dynamo.trtllm ``--disaggregation-mode`` and its LLM-API file)."""
    ref = job.model_ref
    if family == "vllm":
        return ["--model", ref, *engine_args, *(["--is-prefill-worker"] if pool.role == "prefill" else [])]
    if family == "sglang":
        return ["--model-path", ref, "--served-model-name", ref, *engine_args, "--disaggregation-mode", pool.role,
                "--disaggregation-transfer-backend", "nixl"]
    return ["--model-path", ref, "--served-model-name", ref, *engine_args, "--disaggregation-mode", pool.role,
            "--disaggregation-strategy", "decode_first"]


def deployment(job: ServeJob, family: str, args: dict[str, list[str]], head: list[str]) -> tuple[str, list[str]]:
    """(``dynamo_disagg.yaml`` text, what it cannot express) for a disaggregated ``job``; ``args``: each pool
    role's engine options (without model, port or connector)."""
    image, module, workdir = WORKERS[family]
    name = f"{family}-disagg"
    services: dict = {"Frontend": {"dynamoNamespace": name, "componentType": "frontend", "replicas": 1,
                                   "extraPodSpec": {"mainContainer": {"image": IMAGE.format(image=image)}}}}
    notes = []
    for pool in job.pools:
        services[f"{pool.role.capitalize()}Worker"] = {
            "dynamoNamespace": name, "envFromSecret": "hf-token-secret", "componentType": "worker",
            "subComponentType": pool.role, "replicas": pool.replicas,
            "resources": {"limits": {"gpu": str(pool.plan.gpus_per_replica)}},
            "extraPodSpec": {"mainContainer": {
                "image": IMAGE.format(image=image), "workingDir": workdir, "command": ["python3", "-m", module],
                "args": role_args(family, job, pool, args[pool.role])}}}
        if replica_nodes(pool) > 1:
            notes.append(f"a {pool.role} replica spans {replica_nodes(pool)} nodes: the file asks for "
                         f"{pool.plan.gpus_per_replica} GPUs in one pod; give the worker Dynamo's multinode "
                         "settings by hand")
    body = {"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": name},
            "spec": {"services": services}}
    lines = [f"# {h}" if h and not h.startswith("#") else h for h in head]
    lines += [f"# NVIDIA Dynamo {VERSION}: kubectl apply -f dynamo_disagg.yaml (Dynamo operator installed); the "
              "frontend serves the OpenAI API on port 8000", *[f"# approximation: {n}" for n in notes]]
    if family == "trtllm":
        lines.append("# the workers read extra_llm_api_options.prefill.yaml and .decode.yaml from their working "
                     "directory: mount both there (e.g. from a ConfigMap)")
    return "\n".join([*lines, *to_yaml(body)]) + "\n", notes
