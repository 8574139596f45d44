#!/usr/bin/env bash
# meshplan export for Megatron-LM
# target: Megatron-LM core_v0.16.1 (megatron-core 0.16.1) pretrain_gpt.py
# model: llama3.1-70b (80 layers); gpus: 64xh100-sxm
# plan: global_batch=128, seq_len=8192, tp=4, sp=True, cp=2, pp=4, vpp=5, dp=2, zero=1, framework=nemo
# exact: Megatron-LM expresses every part of the plan
# launch on 64 GPUs, adding tokenizer, data and optimizer arguments:
#   torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py \
#       "${MEGATRON_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ... --train-iters ...
MEGATRON_ARGS=(
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
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
    --make-vocab-size-divisible-by 32064
    --position-embedding-type rope
    --rotary-base 500000
    --use-rope-scaling
    --rope-scaling-factor 8
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 4
    --context-parallel-size 2
    --cp-comm-type p2p
    --sequence-parallel
    --num-layers-per-virtual-pipeline-stage 4
    --micro-batch-size 1
    --global-batch-size 128
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --grad-reduce-in-bf16
    --bf16
)
