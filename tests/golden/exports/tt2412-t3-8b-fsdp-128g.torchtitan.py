"""meshplan export: torchtitan >= 0.3 config registry."""
# meshplan export for torchtitan
# target: torchtitan 0.3.0 (torchtitan/config/configs.py config registry)
# model: llama3-8b (32 layers); gpus: 128xh100-hbm2e-96gb
# plan: global_batch=256, seq_len=8192, micro_batch=2, dp=128, zero=3, recompute=selective, framework=torchtitan
# APPROXIMATE: torchtitan cannot express 1 part(s) of the plan:
#   - RoPE: torchtitan's llama3 8B uses base 500000 with llama3 scaling x8; the model has base 500000, scaling none
# run: torchrun ... -m torchtitan.train --module THIS_MODULE --config meshplan_config

from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_8b


def meshplan_config():
    """llama3-8b on 128 GPUs."""
    config = llama3_8b()
    config.training = TrainingConfig(
        local_batch_size=2,
        global_batch_size=256,
        seq_len=8192,
        mixed_precision_param='bfloat16',
    )
    config.parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=128,
        tensor_parallel_degree=1,
        context_parallel_degree=1,
        enable_sequence_parallel=True,
    )
    config.activation_checkpoint = SelectiveAC.Config()
    config.compile = CompileConfig(enable=False)
    return config
