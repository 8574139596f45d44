"""Hand-edited input files (clusters, GPU profiles, models, Hugging Face configs, plan files) and ``--gpus``
shorthand: every bad value is refused with a SpecError naming the field, never a traceback or a silent guess."""

import json

import pytest

from meshplan import catalog
from meshplan.cli import main
from meshplan.errors import SpecError, close_matches
from meshplan.spec.cluster import Derating, NetworkLevel
from meshplan.spec.hardware import GPUSpec, PeakFlops
from meshplan.spec.hf import model_from_hf
from meshplan.spec.io import parse_gpus
from meshplan.spec.model import MoESpec, decoder_model
from meshplan.spec.plan_file import read_plan_file

POOL = '[[pools]]\ngpu = "h100-sxm"\n'
GPU = ('name = "x"\ngeneration = "hopper"\nhbm_gb = 80\nhbm_tb_s = 3.35\nnvlink_gb_s = 900\nnic_gbit_s = 400\n'
       "{extra}\n[peak_tflops]\nbf16 = {bf16}\n")
MODEL = 'name = "x"\nn_layers = 32\nhidden = 4096\nn_heads = 32\nffn_hidden = 14336\nvocab = 128256\n'
HF = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
      "intermediate_size": 14336, "vocab_size": 128256}
PLAN = '[plan]\nglobal_batch = 64\nseq_len = 4096\ndp = 8\n'


def refused(call, *needles: str) -> str:
    """The SpecError ``call()`` raises; each needle is in its message."""
    with pytest.raises(SpecError) as info:
        call()
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, msg
    return msg


# ---------------------------------------------------------------- --gpus shorthand (items 1, 41)
@pytest.mark.parametrize("text", ["²xh100-sxm", "８xh100-sxm", "8xh100-sxm+2xserver@nan", "8xh100-sxm+2xserver@inf",
                                  "8xh100-sxm+2xserver@1e400", "8xh100-sxm+2xserver@", "8xh100-sxm+8xserver+4xserver"])
def test_gpus_shorthand_refused(text):
    refused(lambda: parse_gpus(text, catalog.gpu), "--gpus", repr(text))


def test_gpus_shorthand_valid_servers_unchanged():
    c = parse_gpus("8xh100-sxm+2xserver@12.5", catalog.gpu)
    assert c.servers == 2 and c.server_bandwidth == 12.5e9
    assert parse_gpus("8xh100-sxm+2xserver", catalog.gpu).server_bandwidth == 0.0


# ---------------------------------------------------------------- cluster files (items 6-14, 43-44, 48)
@pytest.mark.parametrize("body, field", [
    (POOL + 'n_gpus = "abc"\n', "pools[0].n_gpus"),
    (POOL + "n_gpus = 8.7\n", "pools[0].n_gpus"),
    (POOL + "n_gpus = true\n", "pools[0].n_gpus"),
    (POOL + 'n_gpus = 8\ngpus_per_node = "eight"\n', "pools[0].gpus_per_node"),
    (POOL + "n_gpus = 8\ngpus_per_node = 3\n", "pools[0].gpus_per_node"),
    ('inter_pool_gb_s = "fast"\n' + POOL + "n_gpus = 8\n", "inter_pool_gb_s"),
    ("inter_pool_gb_s = -5\n" + POOL + "n_gpus = 8\n", "inter_pool_gb_s"),
    ("name = 5\n" + POOL + "n_gpus = 8\n", ".name"),
    ("pools = 5\n", ".pools"),
    (POOL + "n_gpus = 8\nlevels = 5\n", "pools[0].levels"),
    (POOL + 'n_gpus = 8\n[[pools.levels]]\nname = "nvlink"\nspan = 8\nbandwidth_gb_s = "fast"\n',
     "levels[0].bandwidth_gb_s"),
    (POOL + 'n_gpus = 8\n[[pools.levels]]\nname = "nvlink"\nspan = 8\nbandwidth_gb_s = nan\n',
     "levels[0].bandwidth_gb_s"),
    (POOL + 'n_gpus = 8\n[[pools.levels]]\nname = "nvlink"\nspan = 8\nbandwidth_gb_s = inf\n',
     "levels[0].bandwidth_gb_s"),
    ("[[pools]]\ngpu = 5\nn_gpus = 8\n", "pools[0].gpu"),
    ("[[pools]]\nn_gpus = 8\n[pools.gpu]\n" + GPU.format(extra="", bf16=989).replace("hbm_gb = 80", 'hbm_gb = "lots"')
     .replace("[peak_tflops]", "[pools.gpu.peak_tflops]"), "pools[0].gpu.hbm_gb"),
    ("[derating]\nlinks = [[99, 0.5]]\n" + POOL + "n_gpus = 8\n", "derating.links"),
    ("[derating]\ngpus = [[1, 0.5], [1, 0.9]]\n" + POOL + "n_gpus = 16\n", "derating.gpus"),
])
def test_cluster_file_refused(tmp_path, body, field):
    path = tmp_path / "c.toml"
    path.write_text(body)
    refused(lambda: catalog.cluster(str(path)), field)


def test_cluster_file_valid_unchanged(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("inter_pool_gb_s = 0\n" + POOL + "n_gpus = 16\ngpus_per_node = 8\n[derating]\nlinks = [[1, 0.5]]\n")
    c = catalog.cluster(str(path))
    assert c.n_gpus == 16 and c.pools[0].gpus_per_node == 8 and c.derating.links == ((1, 0.5),)


@pytest.mark.parametrize("ref, needle", [("{tmp}/nonexist.toml", "no such file"), ("{tmp}", "is a folder"),
                                         ("/dev/null", "not a regular file")])
def test_cluster_path_that_is_no_file(tmp_path, ref, needle):
    msg = refused(lambda: catalog.cluster(ref.format(tmp=tmp_path)), needle)
    assert "--gpus" not in msg


def test_network_level_and_derating_refuse_nan():
    refused(lambda: NetworkLevel(name="ib", span=8, bandwidth=float("nan"), latency=0.0), "network.ib.bandwidth")
    refused(lambda: Derating(gpus=((3, 0.5), (3, 0.7))), "derating.gpus", "twice")


# ---------------------------------------------------------------- GPU profiles (items 15-19)
@pytest.mark.parametrize("extra, bf16, field", [
    ("", "'x'", "peak_tflops.bf16"),
    ("", "nan", "peak_tflops.bf16"),
    ("usable_gib = 'x'\nusable_source = 'm'", 989, "usable_gib"),
    ("nvlink_domain = 'eight'", 989, "nvlink_domain"),
    ("intra_latency_us = -5", 989, "intra_latency_us"),
])
def test_gpu_file_refused(tmp_path, extra, bf16, field):
    path = tmp_path / "g.toml"
    path.write_text(GPU.format(extra=extra, bf16=bf16))
    refused(lambda: catalog.gpu(str(path)), f"{path}.{field}")


@pytest.mark.parametrize("hbm", ["'lots'", "nan", "inf", "-80"])
def test_gpu_file_memory_refused(tmp_path, hbm):
    path = tmp_path / "g.toml"
    path.write_text(GPU.format(extra="", bf16=989).replace("hbm_gb = 80", f"hbm_gb = {hbm}"))
    refused(lambda: catalog.gpu(str(path)), f"{path}.hbm_gb")


def test_gpu_spec_refuses_nan_memory():
    refused(lambda: GPUSpec(name="x", generation="hopper", peak=PeakFlops(bf16=1e15), hbm_bytes=float("nan"),
                            hbm_bandwidth=1e12, intra_bandwidth=1e11, nic_bandwidth=1e10), "gpu[x].hbm_bytes")


# ---------------------------------------------------------------- model files (items 20-23, 44)
@pytest.mark.parametrize("edit, field", [
    (("n_heads = 32", "n_heads = 0"), "n_heads"),
    (("n_heads = 32", 'n_heads = "x"'), "n_heads"),
    (("n_layers = 32", 'n_layers = "many"'), "n_layers"),
    (("hidden = 4096", "hidden = 4097"), "hidden"),
    (('name = "x"', "name = 5"), "name"),
    (("vocab = 128256", "vocab = 128256\nbias = \"yes\""), "bias"),
    (("vocab = 128256", "vocab = 128256\n[moe]\nn_experts = 8\ntop_k = 2\nexpert_ffn_hidden = 1024\n"
                        "n_shared_experts = -1"), "n_shared_experts"),
])
def test_model_file_refused(tmp_path, edit, field):
    path = tmp_path / "m.toml"
    path.write_text(MODEL.replace(*edit))
    refused(lambda: catalog.model(str(path)), field)


def test_model_file_odd_hidden_with_head_dim_is_kept(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(MODEL.replace("hidden = 4096", "hidden = 4097\nhead_dim = 128"))
    assert catalog.model(str(path)).decoder.attention.head_dim == 128


@pytest.mark.parametrize("text", ["5", "null", "[1, 2]", '"abc"'])
def test_model_json_not_a_table(tmp_path, text):
    path = tmp_path / "m.json"
    path.write_text(text)
    refused(lambda: catalog.model(str(path)), str(path), "must be a table")


def test_decoder_model_refuses_zero_heads():
    refused(lambda: decoder_model(name="x", n_layers=2, hidden=64, n_heads=0, n_kv_heads=1, ffn_hidden=128,
                                  vocab=100), "n_heads")
    refused(lambda: MoESpec(n_experts=8, top_k=2, expert_ffn_hidden=64, n_shared_experts=-1), "n_shared_experts")


# ---------------------------------------------------------------- Hugging Face configs (item 24)
@pytest.mark.parametrize("change, field", [
    ({"num_attention_heads": 0}, "config.num_attention_heads"),
    ({"num_attention_heads": "x"}, "config.num_attention_heads"),
    ({"hidden_size": "big"}, "config.hidden_size"),
    ({"rms_norm_eps": "x"}, "config.rms_norm_eps"),
    ({"max_position_embeddings": "x"}, "config.max_position_embeddings"),
    ({"max_position_embeddings": 1.5}, "config.max_position_embeddings"),
    ({"rope_theta": "x"}, "config.rope_theta"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": "x"}}, "config.rope_scaling.factor"),
    ({"rope_scaling": 5}, "config.rope_scaling"),
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": "x"},
     "config.n_shared_experts"),
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "first_k_dense_replace": "x"},
     "config.first_k_dense_replace"),
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": "x"},
     "config.router_aux_loss_coef"),
    ({"model_type": "gpt2", "n_embd": 768, "n_head": 0, "n_layer": 12}, "config.n_head"),
])
def test_hf_config_refused(change, field):
    refused(lambda: model_from_hf({**HF, **change}), field)


def test_hf_config_valid_unchanged():
    m = model_from_hf({**HF, "max_position_embeddings": 131072, "rope_theta": 500000.0,
                       "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    assert m.max_seq_len == 131072 and m.rope_theta == 500000.0 and m.rope_scaling_factor == 8.0
    assert m.decoder.attention.head_dim == 128


# ---------------------------------------------------------------- plan files (items 25-27, 54)
@pytest.mark.parametrize("name, text, field", [
    ("null.json", "null", "null.json"),
    ("p.toml", "model = 5\n" + PLAN, "p.toml.model"),
    ("p.toml", 'model = "llama3-8b"\ngpus = 8\n' + PLAN, "p.toml.gpus"),
    ("p.toml", 'model = "llama3-8b"\ncluster = 5\n' + PLAN, "p.toml.cluster"),
    ("p.toml", 'model = "llama3-8b"\ngpus = "8xh100-sxm"\npredicted = 5\n' + PLAN, "p.toml.predicted"),
    ("p.toml", 'model = "llama3-8b"\n' + PLAN + "[predicted]\nmax_memory_fraction = 'z'\n",
     "predicted.max_memory_fraction"),
    ("p.toml", 'model = "llama3-8b"\ngpus = "8xh100-sxm"\n', "[plan] table"),
    ("p.toml", PLAN + "pp = 2\nlayer_split = 'abc'\n", "p.toml.plan.layer_split"),
    ("p.toml", PLAN + "tp = true\n", "p.toml.plan.tp"),
])
def test_plan_file_refused(tmp_path, name, text, field):
    path = tmp_path / name
    path.write_text(text)
    refused(lambda: read_plan_file(path), field)


def test_plan_file_cluster_reference_missing(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text(f'model = "llama3-8b"\ncluster = "{tmp_path}/nonexist.toml"\n' + PLAN)
    assert main(["estimate", "--plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "nonexist.toml" in err and "Traceback" not in err


# ---------------------------------------------------------------- close matches (item 56)
def test_close_matches_prefers_prefixes():
    assert close_matches("h100", catalog.gpu_names())[:2] == ["h100-sxm", "h100-pcie"]
    assert close_matches("megatron-cor", catalog.framework_names())[0] == "megatron-core"


# ---------------------------------------------------------------- the CLI: one line, exit 2
@pytest.mark.parametrize("args, files, needle", [
    (["demo", "--gpus", "²xh100-sxm"], {}, "--gpus"),
    (["plan", "--model", "llama3-8b", "--cluster", "{c}", "--global-batch", "64", "--seq-len", "4096"],
     {"c": POOL + 'n_gpus = "abc"\n'}, "pools[0].n_gpus"),
    (["estimate", "--model", "{m}", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len", "4096"],
     {"m": MODEL.replace("n_heads = 32", "n_heads = 0")}, "n_heads"),
    (["estimate", "--model", "{hf}", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len", "4096"],
     {"hf": json.dumps({**HF, "rope_scaling": 5})}, "config.rope_scaling"),
    (["estimate", "--plan", "{p}"], {"p": "model = 5\n" + PLAN}, ".model"),
    (["plan", "--model", "llama3-8b", "--cluster", "/nonexist.toml", "--global-batch", "64", "--seq-len", "4096"],
     {}, "no such file"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8xh100-sxm6", "--global-batch", "8", "--seq-len", "8"], {},
     "did you mean: h100-sxm"),
])
def test_cli_one_line_exit_2(tmp_path, capsys, args, files, needle):
    paths = {}
    for key, text in files.items():
        paths[key] = tmp_path / (f"{key}.json" if key == "hf" else f"{key}.toml")
        paths[key].write_text(text)
    assert main([a.format(**paths) for a in args]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert "Traceback" not in err


def test_validate_skips_a_row_with_zero_heads(tmp_path, capsys):
    row = {"id": "r1", "model": "m", "arch": "dense", "n_layers": "24", "hidden": "2304", "ffn_hidden": "9216",
           "n_heads": "0", "n_kv_heads": "24", "vocab": "51200", "seq_len": "2048", "global_batch": "512",
           "micro_batch": "16", "gpu": "a100-80gb", "n_gpus": "32", "gpus_per_node": "8", "tp": "1", "pp": "1",
           "dp": "32", "precision": "fp16", "framework": "megatron-lm", "step_time_s": "3.5"}
    path = tmp_path / "runs.csv"
    path.write_text(",".join(row) + "\n" + ",".join(row.values()) + "\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "n_heads = 0" in err and "Traceback" not in err
