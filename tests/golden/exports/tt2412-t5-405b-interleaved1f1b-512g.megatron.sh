#!/usr/bin/env bash
# APPROXIMATE: the plan was predicted for the torchtitan-compiled stack; megatron runs it as megatron-core (kernels, sharding and overlap differ): re-predict with --framework megatron-core
# meshplan export for Megatron-LM
# target: Megatron-LM core_v0.16.1 (megatron-core 0.16.1) pretrain_gpt.py
# model: llama3.1-405b (126 layers); gpus: 512xh100-hbm2e-96gb
# plan: global_batch=256, seq_len=8192, tp=8, sp=True, pp=8, vpp=2, schedule=interleaved_1f1b, dp=8, zero=3, recompute=full, precision=fp8, framework=torchtitan-compiled
# exact: Megatron-LM expresses every part of the plan
# launch on 512 GPUs, adding tokenizer, data and optimizer arguments:
#   torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py \
#       "${MEGATRON_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ... --train-iters ...
MEGATRON_ARGS=(
    --num-layers 126
    --hidden-size 16384
    --ffn-hidden-size 53248
    --num-attention-heads 128
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 131072
    --normalization RMSNorm
    --norm-epsilon 1e-05
    --swiglu
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --untie-embeddings-and-output-weights
    --vocab-size 128256
    --make-vocab-size-divisible-by 16032
    --position-embedding-type rope
    --rotary-base 500000
    --use-rope-scaling
    --rope-scaling-factor 8
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 8
    --sequence-parallel
    --tp-comm-overlap
    --pipeline-model-parallel-layout 'Et*7|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*8|t*7L'
    --micro-batch-size 1
    --global-batch-size 256
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    --use-distributed-optimizer
    --use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads_params
    --overlap-grad-reduce
    --overlap-param-gather
    --bf16
    --fp8-format hybrid
)
