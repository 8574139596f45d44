# APPROXIMATE: the plan was predicted for the megatron-bridge stack; deepspeed runs it as megatron-deepspeed (kernels, sharding and overlap differ): re-predict with --framework megatron-deepspeed
#!/usr/bin/env bash
# meshplan export for DeepSpeed
# model: deepseek-v3 (61 layers); gpus: 256xb200
# plan: global_batch=2048, seq_len=4096, pp=16, dp=16, zero=1, ep=8, precision=fp8, framework=megatron-bridge
# APPROXIMATE: DeepSpeed cannot express 5 part(s) of the plan:
#   - fp8: DeepSpeed's config has no FP8 training; exported as bf16
#   - optimizer_dtype=bf16: DeepSpeed's FusedAdam keeps fp32 moments; exported as fp32
#   - multi-latent attention: Megatron-DeepSpeed has no MLA; exported as multi-head attention
#   - MoE with shared experts or leading dense layers: Megatron-DeepSpeed places experts every --expert-interval layers without shared experts; exported with experts in every layer
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
    --max-position-embeddings 4096
    --normalization rmsnorm
    --swiglu
    --use-rotary-position-embeddings
    --no-position-embedding
    --untie-embeddings-and-output-weights
    --num-experts 256
    --topk 8
    --expert-interval 1
    --moe-expert-parallel-size 8
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
