"""Model FLOPs of a training step, the numerator of MFU."""

from __future__ import annotations

from meshplan.cost.ops import layer_ops
from meshplan.cost.stage import mtp_depth
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


def model_flops(model: ModelSpec, plan: Plan) -> float:
    """Model FLOPs per step: 3x the forward (GEMMs, causal attention core, logits), no recompute, counted on
    the unpartitioned model (the 'model FLOPs' of Korthikanti et al. 2022, sec. 6)."""
    unit = Plan(global_batch=1, seq_len=plan.seq_len, micro_batch=1)
    flash = FrameworkProfile(name="model-flops")  # causal attention counted once, whatever kernel runs it
    fwd = 0.0
    for b in model.blocks:
        ops = layer_ops(b.layer, tokens=b.tokens or plan.seq_len, plan=unit, stack=flash,
                        seq=b.tokens or plan.seq_len)
        fwd += b.n_layers * (sum(g.flops for g in ops.gemms) + ops.attn_flops)
    fwd += 2.0 * plan.seq_len * model.hidden * model.vocab * (1 + mtp_depth(model))  # one head per MTP depth
    return 3.0 * fwd * plan.global_batch
