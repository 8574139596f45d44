"""Framework-neutral facts about a plan that several exporters need: the pipeline split and its shape."""

from __future__ import annotations

from meshplan.cost.stage import mtp_depth
from meshplan.spec.checks import layer_split
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import is_csv


def stage_layers(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """Layers per virtual stage in pipeline order (pp*vpp entries)."""
    return layer_split(model, plan)


def decoder_layers(model: ModelSpec) -> int:
    """Layers without the multi-token-prediction modules (the frameworks count those apart: Megatron's
    ``--mtp-num-layers``)."""
    return model.n_layers - mtp_depth(model)


def decoder_split(model: ModelSpec, plan: Plan) -> tuple[int, ...]:
    """Decoder layers per virtual stage: meshplan's split less the MTP modules it counts on the last stage(s),
    where Megatron-Core builds them (``mtp_on_this_rank``: the last pipeline stage).

    Example: DeepSeek-V3 with one MTP module on 4 stages (16, 16, 15, 15) -> (16, 16, 15, 14).
    """
    split, left = list(stage_layers(model, plan)), mtp_depth(model)
    for i in range(len(split) - 1, -1, -1):
        take = min(split[i], left)
        split[i], left = split[i] - take, left - take
    return tuple(split)


def uniform_split(split: tuple[int, ...]) -> int:
    """Layers per stage when every stage holds the same number, else 0."""
    return split[0] if split and all(x == split[0] for x in split) else 0


def first_last_split(split: tuple[int, ...]) -> tuple[int, int] | None:
    """(first, last) when only the first and/or last stage differ from equal middle stages, else None.

    Example: (3, 4, 4, 2) -> (3, 2); (4, 4, 4, 4) -> None (uniform); (3, 4, 5, 2) -> None.
    """
    if len(split) < 3 or uniform_split(split):
        return None
    middle = split[1:-1]
    if not uniform_split(middle):
        return None
    return split[0], split[-1]


def is_csv_schedule(plan: Plan) -> bool:
    """The plan's schedule is a torch.distributed.pipelining custom-schedule CSV file."""
    return is_csv(plan.schedule_name)


def moe_first_dense(model: ModelSpec) -> int:
    """Leading dense layers before the MoE layers (DeepSeek-V3: 3), or -1 when the pattern is not
    'dense block(s) then MoE block(s)'."""
    kinds = [b.layer.moe is not None for b in model.blocks]
    if True not in kinds:
        return -1
    first_moe = kinds.index(True)
    if not all(kinds[first_moe:]):
        return -1
    return sum(b.n_layers for b in model.blocks[:first_moe])


def model_notes(model: ModelSpec) -> list[str]:
    """Approximations every framework shares: only the decoder stack (plus MoE's leading dense layers) is
    exported; other block kinds (vision towers, projectors) have no place in a language-model config."""
    out = []
    dec = model.decoder
    for b in model.blocks:
        if b.layer.attention is None or b.tokens or b.layer.hidden != dec.hidden:
            out.append(f"block '{b.name}' ({b.n_layers} layers) is not a decoder block; only the language "
                       "model is exported")
    if model.is_moe and moe_first_dense(model) < 0:
        out.append("the interleaving of dense and MoE blocks is not 'dense first, MoE after'; exported as all MoE")
    return out


def dense_ffn(model: ModelSpec) -> int:
    """FFN width of the dense layers (the first dense block's, else the decoder's)."""
    for b in model.blocks:
        if b.layer.moe is None and b.layer.attention is not None:
            return b.layer.ffn_hidden
    return model.decoder.ffn_hidden
