#!/usr/bin/env bash
# APPROXIMATE: the plan was predicted for the torchtitan stack; deepspeed runs it as megatron-deepspeed (kernels, sharding and overlap differ): re-predict with --framework megatron-deepspeed
# meshplan export for DeepSpeed
# target: Megatron-DeepSpeed f4157bea (2024-12-24) pretrain_gpt.py with DeepSpeed 0.19.8
# model: llama3-8b (32 layers); gpus: 128xh100-hbm2e-96gb
# plan: global_batch=256, seq_len=8192, micro_batch=2, dp=128, zero=3, recompute=selective, framework=torchtitan
# APPROXIMATE: DeepSpeed cannot express 1 part(s) of the plan:
#   - selective recompute, policy op: Megatron-DeepSpeed recomputes only the attention core; exported as that
# source this file, then: deepspeed --num_nodes $NNODES --num_gpus $GPUS_PER_NODE \
#     pretrain_gpt.py "${MDS_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ...
DS_CONFIG="${DS_CONFIG:-ds_config.json}"
cat > "$DS_CONFIG" <<'JSON'
{
  "train_batch_size": 256,
  "train_micro_batch_size_per_gpu": 2,
  "gradient_accumulation_steps": 1,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "wall_clock_breakdown": false,
  "bf16": {
    "enabled": true
  },
  "zero_optimization": {
    "stage": 3,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_scatter": true
  },
  "activation_checkpointing": {
    "partition_activations": false,
    "contiguous_memory_optimization": false,
    "cpu_checkpointing": false
  }
}
JSON
MDS_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --seq-length 8192
    --max-position-embeddings 8192
    --num-key-value-heads 8
    --normalization rmsnorm
    --layernorm-epsilon 1e-05
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --use-rotary-position-embeddings
    --no-position-embedding
    --rotary-position-embeddings-theta 500000
    --no-query-key-layer-scaling
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --vocab-size 128256
    --make-vocab-size-divisible-by 128256
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --no-pipeline-parallel
    --micro-batch-size 2
    --global-batch-size 256
    --bf16
    --recompute-granularity selective
    --use-flash-attn-v2
    --deepspeed
    --deepspeed_config ${DS_CONFIG}
    --zero-stage 3
)
