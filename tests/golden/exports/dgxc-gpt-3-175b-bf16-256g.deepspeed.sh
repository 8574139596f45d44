#!/usr/bin/env bash
# APPROXIMATE: the plan was predicted for the nemo stack; deepspeed runs it as megatron-deepspeed (kernels, sharding and overlap differ): re-predict with --framework megatron-deepspeed
# meshplan export for DeepSpeed
# target: Megatron-DeepSpeed f4157bea (2024-12-24) pretrain_gpt.py with DeepSpeed 0.19.8
# model: gpt3-175b (96 layers); gpus: 256xh100-sxm
# plan: global_batch=512, seq_len=2048, tp=4, sp=True, pp=8, vpp=12, dp=8, zero=1, framework=nemo
# APPROXIMATE: DeepSpeed cannot express 1 part(s) of the plan:
#   - schedule interleaved_1f1b with vpp=12: DeepSpeed's pipeline engine runs 1F1B on one stage per rank (or ZB-H1); exported as 1F1B
# source this file, then: deepspeed --num_nodes $NNODES --num_gpus $GPUS_PER_NODE \
#     pretrain_gpt.py "${MDS_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ...
DS_CONFIG="${DS_CONFIG:-ds_config.json}"
cat > "$DS_CONFIG" <<'JSON'
{
  "train_batch_size": 512,
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 64,
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
    --num-layers 96
    --hidden-size 12288
    --ffn-hidden-size 49152
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --normalization layernorm
    --layernorm-epsilon 1e-05
    --no-query-key-layer-scaling
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --vocab-size 51200
    --make-vocab-size-divisible-by 12800
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 8
    --sequence-parallel
    --micro-batch-size 1
    --global-batch-size 512
    --bf16
    --use-flash-attn-v2
    --deepspeed
    --deepspeed_config ${DS_CONFIG}
    --zero-stage 1
)
