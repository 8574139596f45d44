#!/usr/bin/env bash
# APPROXIMATE: the plan was predicted for the megatron-bridge stack; deepspeed runs it as megatron-deepspeed (kernels, sharding and overlap differ): re-predict with --framework megatron-deepspeed
# meshplan export for DeepSpeed
# target: Megatron-DeepSpeed f4157bea (2024-12-24) pretrain_gpt.py with DeepSpeed 0.19.8
# model: deepseek-v3 (61 layers); gpus: 256xb200
# plan: global_batch=2048, seq_len=4096, pp=16, dp=16, zero=1, ep=8, precision=fp8, framework=megatron-bridge
# APPROXIMATE: DeepSpeed cannot express 9 part(s) of the plan:
#   - fp8: DeepSpeed's config has no FP8 training; exported as bf16
#   - optimizer_dtype=bf16: DeepSpeed's FusedAdam keeps fp32 moments; exported as fp32
#   - multi-latent attention: Megatron-DeepSpeed has no MLA; exported as multi-head attention
#   - q/k normalization: Megatron-DeepSpeed's attention has no q/k norm; exported without it
#   - MoE with shared experts or leading dense layers: Megatron-DeepSpeed places experts every --expert-interval layers without shared experts; exported with experts in every layer
#   - router: DeepSpeed-MoE's TopKGate (deepspeed/moe/sharded_moe.py) is softmax top-k; the model's sigmoid scores, expert bias, group-limited routing or top-k scale are not exported
#   - balance loss seq_aux_loss: DeepSpeed-MoE adds its per-batch l_aux; exported as that
#   - RoPE scaling yarn (factor 40): Megatron-DeepSpeed's RotaryEmbedding has none; exported unscaled
#   - uneven pipeline split: DeepSpeed's PipelineModule balances layers itself; exported as even
# source this file, then: deepspeed --num_nodes $NNODES --num_gpus $GPUS_PER_NODE \
#     pretrain_gpt.py "${MDS_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ...
DS_CONFIG="${DS_CONFIG:-ds_config.json}"
cat > "$DS_CONFIG" <<'JSON'
{
  "train_batch_size": 2048,
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 128,
  "gradient_clipping": 1.0,
  "steps_per_print": 10,
  "wall_clock_breakdown": false,
  "bf16": {
    "enabled": true
  },
  "zero_optimization": {
    "stage": 1,
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_scatter": true
  },
  "data_types": {
    "grad_accum_dtype": "bf16"
  }
}
JSON
MDS_ARGS=(
    --num-layers 61
    --hidden-size 7168
    --ffn-hidden-size 2048
    --num-attention-heads 128
    --seq-length 4096
    --max-position-embeddings 163840
    --normalization rmsnorm
    --layernorm-epsilon 1e-06
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --use-rotary-position-embeddings
    --no-position-embedding
    --rotary-position-embeddings-theta 10000
    --no-query-key-layer-scaling
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --vocab-size 129280
    --make-vocab-size-divisible-by 129280
    --num-experts 256
    --topk 8
    --expert-interval 1
    --moe-expert-parallel-size 8
    --moe-loss-coeff 0.0001
    --create-moe-param-group
    --disable-moe-token-dropping
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 16
    --micro-batch-size 1
    --global-batch-size 2048
    --bf16
    --use-flash-attn-v2
    --deepspeed
    --deepspeed_config ${DS_CONFIG}
    --zero-stage 1
)
