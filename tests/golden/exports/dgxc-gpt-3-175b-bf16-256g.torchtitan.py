# APPROXIMATE: the plan was predicted for the nemo stack; torchtitan runs it as torchtitan (kernels, sharding and overlap differ): re-predict with --framework torchtitan
"""meshplan export: torchtitan >= 0.3 config registry."""
# meshplan export for torchtitan
# target: torchtitan 0.3.0 (torchtitan/config/configs.py config registry)
# model: gpt3-175b (96 layers); gpus: 256xh100-sxm
# plan: global_batch=512, seq_len=2048, tp=4, sp=True, pp=8, vpp=12, dp=8, zero=1, framework=nemo
# APPROXIMATE: torchtitan cannot express 3 part(s) of the plan:
#   - model gpt3-175b: torchtitan ships no flavor with 96 layers x 12288 (gpt); the config names flavor 'gpt3-175b' of 'llama3', which you must register
#   - ZeRO-1: torchtitan shards with FSDP2 only; exported as FSDP without resharding after forward (gradients are sharded too, as in ZeRO-2)
#   - grad_dtype=bf16, optimizer_dtype=fp32: torchtitan reduces gradients and keeps AdamW states in fp32; exported as fp32
# run: torchrun ... -m torchtitan.train --module THIS_MODULE --config meshplan_config

from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def meshplan_config():
    """gpt3-175b on 256 GPUs."""
    config = llama3_8b()
    # register flavor 'gpt3-175b' in torchtitan.models.llama3, then use it below
    config.training = TrainingConfig(
        local_batch_size=64,
        global_batch_size=512,
        seq_len=2048,
        mixed_precision_param='bfloat16',
        disable_cuda_graphs=True,
    )
    config.parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=8,
        fsdp_reshard_after_forward='never',
        tensor_parallel_degree=4,
        pipeline_parallel_degree=8,
        pipeline_parallel_microbatch_size=1,
        pipeline_parallel_schedule='Interleaved1F1B',
        module_fqns_per_model_part=[['tok_embeddings', 'layers.0'], ['layers.1'], ['layers.2'], ['layers.3'], ['layers.4'], ['layers.5'], ['layers.6'], ['layers.7'], ['layers.8'], ['layers.9'], ['layers.10'], ['layers.11'], ['layers.12'], ['layers.13'], ['layers.14'], ['layers.15'], ['layers.16'], ['layers.17'], ['layers.18'], ['layers.19'], ['layers.20'], ['layers.21'], ['layers.22'], ['layers.23'], ['layers.24'], ['layers.25'], ['layers.26'], ['layers.27'], ['layers.28'], ['layers.29'], ['layers.30'], ['layers.31'], ['layers.32'], ['layers.33'], ['layers.34'], ['layers.35'], ['layers.36'], ['layers.37'], ['layers.38'], ['layers.39'], ['layers.40'], ['layers.41'], ['layers.42'], ['layers.43'], ['layers.44'], ['layers.45'], ['layers.46'], ['layers.47'], ['layers.48'], ['layers.49'], ['layers.50'], ['layers.51'], ['layers.52'], ['layers.53'], ['layers.54'], ['layers.55'], ['layers.56'], ['layers.57'], ['layers.58'], ['layers.59'], ['layers.60'], ['layers.61'], ['layers.62'], ['layers.63'], ['layers.64'], ['layers.65'], ['layers.66'], ['layers.67'], ['layers.68'], ['layers.69'], ['layers.70'], ['layers.71'], ['layers.72'], ['layers.73'], ['layers.74'], ['layers.75'], ['layers.76'], ['layers.77'], ['layers.78'], ['layers.79'], ['layers.80'], ['layers.81'], ['layers.82'], ['layers.83'], ['layers.84'], ['layers.85'], ['layers.86'], ['layers.87'], ['layers.88'], ['layers.89'], ['layers.90'], ['layers.91'], ['layers.92'], ['layers.93'], ['layers.94'], ['layers.95', 'norm', 'lm_head']],
        context_parallel_degree=1,
        enable_sequence_parallel=True,
    )
    config.activation_checkpoint = None
    config.compile = CompileConfig(enable=True)
    return config
