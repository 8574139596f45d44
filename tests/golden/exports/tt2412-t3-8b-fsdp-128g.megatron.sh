#!/usr/bin/env bash
# APPROXIMATE: the plan was predicted for the torchtitan stack; megatron runs it as megatron-core (kernels, sharding and overlap differ): re-predict with --framework megatron-core
# meshplan export for Megatron-LM
# target: Megatron-LM core_v0.16.1 (megatron-core 0.16.1) pretrain_gpt.py
# model: llama3-8b (32 layers); gpus: 128xh100-hbm2e-96gb
# plan: global_batch=256, seq_len=8192, micro_batch=2, dp=128, zero=3, recompute=selective, framework=torchtitan
# APPROXIMATE: Megatron-LM cannot express 1 part(s) of the plan:
#   - selective recompute, per-op policy (torchtitan): Megatron-LM has no such module set; exported as its default, the attention core
# launch on 128 GPUs, adding tokenizer, data and optimizer arguments:
#   torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py \
#       "${MEGATRON_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ... --train-iters ...
MEGATRON_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
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
    --vocab-size 128256
    --make-vocab-size-divisible-by 128256
    --position-embedding-type rope
    --rotary-base 500000
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --micro-batch-size 2
    --global-batch-size 256
    --recompute-granularity selective
    --use-distributed-optimizer
    --use-megatron-fsdp
    --data-parallel-sharding-strategy optim_grads_params
    --overlap-grad-reduce
    --overlap-param-gather
    --bf16
)
