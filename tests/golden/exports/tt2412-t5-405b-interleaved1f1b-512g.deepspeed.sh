# APPROXIMATE: the plan was predicted for the torchtitan-compiled stack; deepspeed runs it as megatron-deepspeed (kernels, sharding and overlap differ): re-predict with --framework megatron-deepspeed
#!/usr/bin/env bash
# meshplan export for DeepSpeed
# model: llama3.1-405b (126 layers); gpus: 512xh100-hbm2e-96gb
# plan: global_batch=256, seq_len=8192, tp=8, sp=True, pp=8, vpp=2, schedule=interleaved_1f1b, dp=8, zero=3, recompute=full, precision=fp8, framework=torchtitan-compiled
# APPROXIMATE: DeepSpeed cannot express 5 part(s) of the plan:
#   - fp8: DeepSpeed's config has no FP8 training; exported as bf16
#   - uneven pipeline split: DeepSpeed's PipelineModule balances layers itself; exported as even
#   - schedule interleaved_1f1b with vpp=2: DeepSpeed's pipeline engine runs 1F1B on one stage per rank (or ZB-H1); exported as 1F1B
#   - ZeRO-3 with pipeline parallelism: DeepSpeed's pipeline engine supports ZeRO-1 only
#   - TP communication overlap: Megatron-DeepSpeed has no userbuffers overlap; exported without it
# source this file, then: deepspeed --num_nodes $NNODES --num_gpus $GPUS_PER_NODE \
#     pretrain_gpt.py "${MDS_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ...
DS_CONFIG="${DS_CONFIG:-ds_config.json}"
cat > "$DS_CONFIG" <<'JSON'
{
  "train_batch_size": 256,
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 32,
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
    --num-layers 126
    --hidden-size 16384
    --ffn-hidden-size 53248
    --num-attention-heads 128
    --seq-length 8192
    --max-position-embeddings 8192
    --num-key-value-heads 8
    --normalization rmsnorm
    --swiglu
    --use-rotary-position-embeddings
    --no-position-embedding
    --untie-embeddings-and-output-weights
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 8
    --sequence-parallel
    --micro-batch-size 1
    --global-batch-size 256
    --bf16
    --checkpoint-activations
    --deepspeed-activation-checkpointing
    --use-flash-attn-v2
    --deepspeed
    --deepspeed_config ${DS_CONFIG}
    --zero-stage 3
)
