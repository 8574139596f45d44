"""The NVIDIA Dynamo deployment of a disaggregated plan: the DynamoGraphDeployment names of Dynamo 0.6.1's own
backend examples (components/backends/{vllm,sglang,trtllm}/deploy/disagg.yaml), one worker service per pool with
its replicas, GPUs per replica and the engine's options, and the role switch each wrapper takes."""

from __future__ import annotations

import json

import pytest

from meshplan import catalog
from meshplan.export.serve import export_serving
from meshplan.spec.serving import ServePlan, Workload

REF = "meta-llama/Llama-3.1-70B-Instruct"
ROLE_SWITCH = {"vllm": ("--is-prefill-worker",), "sglang": ("--disaggregation-mode", "prefill"),
               "trtllm": ("--disaggregation-mode", "prefill")}


def _export(engine: str, decode_tp: int = 4):
    pre = ServePlan(tp=2, engine=engine, precision="fp8", kv_dtype="fp8")
    dec = ServePlan(tp=decode_tp, engine=engine, precision="fp8", kv_dtype="fp8")
    return export_serving(model=catalog.model("llama3.1-70b"), model_ref=REF, plan=dec, engine=catalog.engine(engine),
                          work=Workload(input_len=2048, output_len=256, concurrency=32),
                          disagg={"prefill": pre, "decode": dec, "prefill_replicas": 3, "decode_replicas": 1})


def _service(text: str, name: str) -> dict[str, str]:
    """The ``key: value`` lines of one service block (indented under ``services:``)."""
    lines = text.splitlines()
    start = lines.index(f"    {name}:")
    block = []
    for line in lines[start + 1:]:
        if line.startswith("    ") and not line.startswith("     "):
            break
        block.append(line.strip())
    return dict(item.split(": ", 1) for item in block if ": " in item)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_dynamo_deployment_has_one_worker_per_pool(engine):
    out = _export(engine)
    text = out.files["dynamo_disagg.yaml"]
    assert "kind: DynamoGraphDeployment" in text and "apiVersion: nvidia.com/v1alpha1" in text
    front = _service(text, "Frontend")
    assert front["componentType"] == "frontend" and front["replicas"] == "1"
    pre, dec = _service(text, "PrefillWorker"), _service(text, "DecodeWorker")
    assert (pre["subComponentType"], pre["replicas"], pre["gpu"]) == ("prefill", "3", '"2"')
    assert (dec["subComponentType"], dec["replicas"], dec["gpu"]) == ("decode", "1", '"4"')
    assert json.loads(pre["command"]) == ["python3", "-m", f"dynamo.{engine}"]
    assert pre["image"] == f'"nvcr.io/nvidia/ai-dynamo/{engine}-runtime:0.6.1"'
    pre_args, dec_args = json.loads(pre["args"]), json.loads(dec["args"])
    assert REF in pre_args and REF in dec_args
    switch = ROLE_SWITCH[engine]
    i = pre_args.index(switch[0])
    assert tuple(pre_args[i:i + len(switch)]) == switch
    tp_flag = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size", "trtllm": "--tensor-parallel-size"}[engine]
    assert pre_args[pre_args.index(tp_flag) + 1] == "2" and dec_args[dec_args.index(tp_flag) + 1] == "4"
    assert "--kv-transfer-config" not in pre_args  # Dynamo moves the KV cache itself
    assert out.exact


def test_a_pool_spanning_nodes_is_an_approximation():
    out = _export("vllm", decode_tp=16)
    assert any("spans 2 nodes" in a for a in out.approximations)
    assert "# approximation: a decode replica spans 2 nodes" in out.files["dynamo_disagg.yaml"]
