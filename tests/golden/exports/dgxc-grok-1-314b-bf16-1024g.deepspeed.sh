#!/usr/bin/env bash
# APPROXIMATE: the plan was predicted for the nemo stack; deepspeed runs it as megatron-deepspeed (kernels, sharding and overlap differ): re-predict with --framework megatron-deepspeed
# meshplan export for DeepSpeed
# target: Megatron-DeepSpeed f4157bea (2024-12-24) pretrain_gpt.py with DeepSpeed 0.19.8
# model: grok-1-314b (64 layers); gpus: 1024xh100-sxm
# plan: global_batch=2048, seq_len=8192, tp=4, sp=True, cp=2, pp=8, vpp=8, dp=16, zero=1, ep=8, framework=nemo
# APPROXIMATE: DeepSpeed cannot express 3 part(s) of the plan:
#   - GeGLU: Megatron-DeepSpeed has only --swiglu for gated units; exported as SwiGLU
#   - ring context parallel: Megatron-DeepSpeed splits sequences with DeepSpeed-Ulysses (all-to-all); exported as Ulysses
#   - schedule interleaved_1f1b with vpp=8: DeepSpeed's pipeline engine runs 1F1B on one stage per rank (or ZB-H1); exported as 1F1B
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
    --num-layers 64
    --hidden-size 6144
    --ffn-hidden-size 32768
    --num-attention-heads 48
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
    --rotary-position-embeddings-theta 10000
    --no-query-key-layer-scaling
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --vocab-size 131072
    --make-vocab-size-divisible-by 32768
    --num-experts 8
    --topk 2
    --expert-interval 1
    --moe-expert-parallel-size 8
    --moe-loss-coeff 0.0
    --create-moe-param-group
    --disable-moe-token-dropping
    --disable-moe-top2-2nd-expert-sampling
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 8
    --sequence-parallel
    --ds-sequence-parallel-size 2
    --micro-batch-size 1
    --global-batch-size 2048
    --bf16
    --use-flash-attn-v2
    --deepspeed
    --deepspeed_config ${DS_CONFIG}
    --zero-stage 1
)
