#!/usr/bin/env bash
# meshplan export for Megatron-LM
# target: Megatron-LM core_v0.16.1 (megatron-core 0.16.1) pretrain_gpt.py
# model: gpt3-175b (96 layers); gpus: 256xh100-sxm
# plan: global_batch=512, seq_len=2048, tp=4, sp=True, pp=8, vpp=12, dp=8, zero=1, framework=nemo
# exact: Megatron-LM expresses every part of the plan
# launch on 256 GPUs, adding tokenizer, data and optimizer arguments:
#   torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py \
#       "${MEGATRON_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ... --train-iters ...
MEGATRON_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --ffn-hidden-size 49152
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --normalization LayerNorm
    --norm-epsilon 1e-05
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --vocab-size 51200
    --make-vocab-size-divisible-by 12800
    --position-embedding-type learned_absolute
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 8
    --sequence-parallel
    --num-layers-per-virtual-pipeline-stage 1
    --micro-batch-size 1
    --global-batch-size 512
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --grad-reduce-in-bf16
    --bf16
)
