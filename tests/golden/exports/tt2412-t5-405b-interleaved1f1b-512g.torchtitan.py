"""meshplan export: torchtitan >= 0.3 config registry."""
# meshplan export for torchtitan
# target: torchtitan 0.3.0 (torchtitan/config/configs.py config registry)
# model: llama3.1-405b (126 layers); gpus: 512xh100-hbm2e-96gb
# plan: global_batch=256, seq_len=8192, tp=8, sp=True, pp=8, vpp=2, schedule=interleaved_1f1b, dp=8, zero=3, recompute=full, precision=fp8, framework=torchtitan-compiled
# exact: torchtitan expresses every part of the plan
# run: torchrun ... -m torchtitan.train --module THIS_MODULE --config meshplan_config

from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_405b
from torchtitan.components.quantization import Float8LinearConverter


def meshplan_config():
    """llama3.1-405b on 512 GPUs."""
    config = llama3_405b()
    config.model_spec = model_registry('405B', converters=[
        Float8LinearConverter.Config(filter_fqns=['lm_head'], model_compile_enabled=True),
    ])
    config.training = TrainingConfig(
        local_batch_size=32,
        global_batch_size=256,
        seq_len=8192,
        mixed_precision_param='bfloat16',
        disable_cuda_graphs=True,
    )
    config.parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=8,
        tensor_parallel_degree=8,
        pipeline_parallel_degree=8,
        pipeline_parallel_microbatch_size=1,
        pipeline_parallel_schedule='Interleaved1F1B',
        module_fqns_per_model_part=[['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4', 'layers.5', 'layers.6'], ['layers.7', 'layers.8', 'layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13', 'layers.14'], ['layers.15', 'layers.16', 'layers.17', 'layers.18', 'layers.19', 'layers.20', 'layers.21', 'layers.22'], ['layers.23', 'layers.24', 'layers.25', 'layers.26', 'layers.27', 'layers.28', 'layers.29', 'layers.30'], ['layers.31', 'layers.32', 'layers.33', 'layers.34', 'layers.35', 'layers.36', 'layers.37', 'layers.38'], ['layers.39', 'layers.40', 'layers.41', 'layers.42', 'layers.43', 'layers.44', 'layers.45', 'layers.46'], ['layers.47', 'layers.48', 'layers.49', 'layers.50', 'layers.51', 'layers.52', 'layers.53', 'layers.54'], ['layers.55', 'layers.56', 'layers.57', 'layers.58', 'layers.59', 'layers.60', 'layers.61', 'layers.62'], ['layers.63', 'layers.64', 'layers.65', 'layers.66', 'layers.67', 'layers.68', 'layers.69', 'layers.70'], ['layers.71', 'layers.72', 'layers.73', 'layers.74', 'layers.75', 'layers.76', 'layers.77', 'layers.78'], ['layers.79', 'layers.80', 'layers.81', 'layers.82', 'layers.83', 'layers.84', 'layers.85', 'layers.86'], ['layers.87', 'layers.88', 'layers.89', 'layers.90', 'layers.91', 'layers.92', 'layers.93', 'layers.94'], ['layers.95', 'layers.96', 'layers.97', 'layers.98', 'layers.99', 'layers.100', 'layers.101', 'layers.102'], ['layers.103', 'layers.104', 'layers.105', 'layers.106', 'layers.107', 'layers.108', 'layers.109', 'layers.110'], ['layers.111', 'layers.112', 'layers.113', 'layers.114', 'layers.115', 'layers.116', 'layers.117', 'layers.118'], ['layers.119', 'layers.120', 'layers.121', 'layers.122', 'layers.123', 'layers.124', 'layers.125', 'norm', 'lm_head']],
        context_parallel_degree=1,
        enable_sequence_parallel=True,
    )
    config.activation_checkpoint = FullAC.Config()
    config.compile = CompileConfig(enable=True, enable_async_tensor_parallel=True)
    return config
