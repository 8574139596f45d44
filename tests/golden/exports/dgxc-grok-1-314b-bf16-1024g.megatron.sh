#!/usr/bin/env bash
# meshplan export for Megatron-LM
# target: Megatron-LM core_v0.16.1 (megatron-core 0.16.1) pretrain_gpt.py
# model: grok-1-314b (64 layers); gpus: 1024xh100-sxm
# plan: global_batch=2048, seq_len=8192, tp=4, sp=True, cp=2, pp=8, vpp=8, dp=16, zero=1, ep=8, framework=nemo
# APPROXIMATE: Megatron-LM cannot express 1 part(s) of the plan:
#   - GeGLU: pretrain_gpt.py has no flag for gelu with a gated linear unit (--quick-geglu is a different function); exported as --swiglu, which has the same shapes and FLOPs
# launch on 1024 GPUs, adding tokenizer, data and optimizer arguments:
#   torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py \
#       "${MEGATRON_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ... --train-iters ...
MEGATRON_ARGS=(
    --num-layers 64
    --hidden-size 6144
    --ffn-hidden-size 32768
    --num-attention-heads 48
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 8192
    --normalization RMSNorm
    --norm-epsilon 1e-05
    --swiglu
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --untie-embeddings-and-output-weights
    --vocab-size 131072
    --make-vocab-size-divisible-by 32768
    --position-embedding-type rope
    --rotary-base 10000
    --num-experts 8
    --moe-router-topk 2
    --moe-ffn-hidden-size 32768
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --moe-router-score-function softmax
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 0.0
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 8
    --context-parallel-size 2
    --cp-comm-type p2p
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1
    --sequence-parallel
    --num-layers-per-virtual-pipeline-stage 1
    --micro-batch-size 1
    --global-batch-size 2048
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --grad-reduce-in-bf16
    --bf16
)
