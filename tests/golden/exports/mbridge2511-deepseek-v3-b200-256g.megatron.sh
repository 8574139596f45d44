#!/usr/bin/env bash
# meshplan export for Megatron-LM
# target: Megatron-LM core_v0.16.1 (megatron-core 0.16.1) pretrain_gpt.py
# model: deepseek-v3 (61 layers); gpus: 256xb200
# plan: global_batch=2048, seq_len=4096, pp=16, dp=16, zero=1, ep=8, precision=fp8, framework=megatron-bridge
# exact: Megatron-LM expresses every part of the plan
# launch on 256 GPUs, adding tokenizer, data and optimizer arguments:
#   torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py \
#       "${MEGATRON_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ... --train-iters ...
MEGATRON_ARGS=(
    --num-layers 61
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --seq-length 4096
    --max-position-embeddings 163840
    --normalization RMSNorm
    --norm-epsilon 1e-06
    --swiglu
    --disable-bias-linear
    --qk-layernorm
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --untie-embeddings-and-output-weights
    --vocab-size 129280
    --make-vocab-size-divisible-by 129280
    --position-embedding-type rope
    --rotary-base 10000
    --rope-type yarn
    --rotary-scaling-factor 40
    --mscale 1.0
    --mscale-all-dim 1.0
    --multi-latent-attention
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --num-experts 256
    --moe-router-topk 8
    --moe-ffn-hidden-size 2048
    --moe-grouped-gemm
    --moe-shared-expert-intermediate-size 2048
    --moe-layer-freq '([0]*3+[1]*58)'
    --moe-token-dispatcher-type alltoall
    --moe-router-score-function sigmoid
    --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 0.001
    --moe-router-topk-scaling-factor 2.5
    --moe-router-num-groups 8
    --moe-router-group-topk 4
    --moe-router-load-balancing-type seq_aux_loss
    --moe-aux-loss-coeff 0.0001
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 16
    --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1
    --pipeline-model-parallel-layout 'Et*3|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*4|t*3|t*3L'
    --micro-batch-size 1
    --global-batch-size 2048
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --grad-reduce-in-bf16
    --use-precision-aware-optimizer
    --main-grads-dtype bf16
    --exp-avg-dtype bf16
    --exp-avg-sq-dtype bf16
    --bf16
    --fp8-format hybrid
    --fp8-param-gather
)
