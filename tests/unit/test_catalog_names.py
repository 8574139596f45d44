"""Catalog entries answer to their aliases and to the spellings sources print (Hugging Face ids, nvidia-smi
names); a name two entries would share is refused; an id the catalog lacks says how to give its config."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from meshplan import catalog
from meshplan.catalog.names import alias_index, catalog_key
from meshplan.cli import main
from meshplan.cost.memory import model_params
from meshplan.errors import SpecError
from meshplan.spec.hf import model_from_hf

SERVING = Path(__file__).resolve().parents[3] / "shared" / "validation" / "inference_visible.csv"


@pytest.mark.parametrize(("ref", "name"), [
    ("meta-llama/Llama-3.3-70B-Instruct", "llama3.1-70b"),  # same architecture (INFERENCE.md)
    ("Meta-Llama-3.1-8B-Instruct", "llama3.1-8b"),
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "llama3.1-70b"),  # a checkpoint format, not an architecture
    ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b"),
    ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("meta-llama/Llama-2-70b-chat-hf", "llama2-70b"),
    ("Qwen/Qwen3-8B", "qwen3-8b"),
    ("moonshotai/Kimi-K2-Instruct", "kimi-k2"),
    ("llama3.1-70b", "llama3.1-70b"),
])
def test_model_names_sources_print(ref: str, name: str) -> None:
    assert catalog.model(ref).name == name


@pytest.mark.parametrize(("ref", "name"), [
    ("H100-SXM-80GB", "h100-sxm"), ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("H100 SXM5", "h100-sxm"),
    ("A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("H200-SXM-141GB", "h200"),
    ("GH200-480GB", "gh200"), ("AMD Instinct MI300X", "mi300x"), ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("h100", "h100"),  # its own entry, not an alias of h100-sxm
])
def test_gpu_names_sources_print(ref: str, name: str) -> None:
    assert catalog.gpu(ref).name == name


def test_cluster_shorthand_takes_an_alias() -> None:
    assert catalog.cluster("8xh100-sxm5").pools[0].gpu.name == "h100-sxm"


@pytest.mark.skipif(not SERVING.is_file(), reason="shared/validation not present")
def test_every_visible_serving_row_prints_what_its_key_names() -> None:
    """The ``model`` and ``gpu`` columns, as each source printed them, resolve to the row's catalog keys."""
    with SERVING.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    pairs = {("models", r["model"], r["model_key"]) for r in rows} | {("gpus", r["gpu"], r["gpu_key"]) for r in rows}
    assert {(kind, printed, catalog.resolve(kind, printed)) for kind, printed, _ in pairs} == pairs


def test_key_rules() -> None:
    assert catalog_key("models", "meta-llama/Meta-Llama-3.1-8B-Instruct") == "llama3.1-8b"
    assert catalog_key("models", "Qwen2.5_72B Instruct AWQ") == "qwen2.5-72b"
    assert catalog_key("gpus", "a100-80gb") == "a100-80gb"  # memory sizes stay: a100-40gb is another board
    assert catalog_key("gpus", "NVIDIA Tesla V100") == "v100"


def test_a_name_two_entries_share_is_refused() -> None:
    with pytest.raises(SpecError, match=r"models\[b\]\.aliases.*also names models\[a\]"):
        alias_index("models", {"a": {"aliases": ["x-1"]}, "b": {"aliases": ["X 1 Instruct"]}})
    with pytest.raises(SpecError, match="also names"):
        alias_index("models", {"llama3.1-8b": {}, "other": {"aliases": ["Meta-Llama-3.1-8B"]}})
    with pytest.raises(SpecError, match="must be a list of names"):
        alias_index("gpus", {"a": {"aliases": "h100"}})
    assert alias_index("gpus", {"a": {"aliases": ["A-1"]}}) == {"a": "a", "a1": "a"}


def test_catalog_aliases_are_unambiguous() -> None:
    models, gpus = catalog.model_names(), catalog.gpu_names()
    assert all(catalog.resolve("models", n) == n for n in models)
    assert all(catalog.resolve("gpus", n) == n for n in gpus)


def test_unknown_hub_id_says_how_to_give_its_config(capsys) -> None:
    with pytest.raises(SpecError, match=r"neither a file nor a catalog model.*config\.json.*did you mean: llama3-70b"):
        catalog.model("meta-llama/Llama-9-70B")
    code = main(["serve", "--model", "meta-llama/Llama-9-70B", "--gpus", "8xh100-sxm", "--input-len", "1000",
                 "--output-len", "100", "--concurrency", "8"])
    err = capsys.readouterr().err
    assert code != 0 and "config.json" in err and "Traceback" not in err
    with pytest.raises(SpecError, match=r"unknown model.*did you mean: llama3\.2-1b"):
        catalog.model("Llama-3.2-3B-Instruct")


@pytest.mark.parametrize(("name", "billions"), [
    ("mixtral-8x22b", 141),  # Mistral AI's announcement: 141B total parameters
    ("qwen3-8b", 8.2),  # Qwen3-8B model card: 8.2B
    ("qwen3-coder-480b-a35b", 480),  # model card: 480B total
    ("kimi-k2", 1040),  # Kimi K2 technical report: 1.04 trillion total (32B activated)
])
def test_new_models_have_their_published_sizes(name: str, billions: float) -> None:
    assert model_params(catalog.model(name)) / 1e9 == pytest.approx(billions, rel=0.02)


def test_kimi_k2_config_reads_as_deepseek_architecture() -> None:
    cfg = {"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 64,
           "num_key_value_heads": 64, "intermediate_size": 18432, "moe_intermediate_size": 2048, "vocab_size": 163840,
           "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "routed_scaling_factor": 2.827}
    hf = model_from_hf(cfg, name="kimi")
    assert model_params(hf) == pytest.approx(model_params(catalog.model("kimi-k2")), rel=1e-9)


def test_a_catalog_file_with_aliases_loads_as_a_file(tmp_path):
    src = Path(catalog.__file__).parent
    model = catalog.model(str(src / "models" / "deepseek-v3.toml"))
    gpu = catalog.gpu(str(src / "gpus" / "h100-sxm.toml"))
    assert model == catalog.model("deepseek-v3") and gpu == catalog.gpu("h100-sxm")


def test_paths_are_files_and_names_are_catalog_entries(tmp_path, monkeypatch):
    """A missing path is refused (not read as the catalog entry its last part names); a folder named like an
    entry does not hide it; an id-like name that is a file is the file."""
    with pytest.raises(SpecError, match="no such file"):
        catalog.model("/data/ckpt/Llama-3.1-8B")
    with pytest.raises(SpecError, match="no such file"):
        catalog.gpu("./h100")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama3-8b").mkdir()
    (tmp_path / "h100").mkdir()
    assert catalog.model("llama3-8b").name == "llama3-8b" and catalog.gpu("h100").name == "h100"
    with pytest.raises(SpecError, match="model = 'x' * 300|unknown model"):
        catalog.model("x" * 300)
    with pytest.raises(SpecError, match="unknown model"):
        catalog.model("")
    with pytest.raises(SpecError, match="hardware-profile TOML"):
        catalog.gpu("foo/bar")
