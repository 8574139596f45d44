"""The device mesh of a plan: named axes ``pp, dp_replicate, dp_shard, cp, tp`` laid out in the plan's rank order.

The rank order lists axes from fastest-varying to slowest (``tp-cp-ep-dp-pp``); a DeviceMesh's last dim varies
fastest, so the mesh shape is the order reversed. ``ep`` is folded inside dp (Megatron convention) and gets no
axis of its own; dp is split into (dp_replicate, dp_shard), replicas outermost.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshplan.spec.plan import Plan

MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

# torch 2.13 warns, once per rank, each time a flattened dim is sliced from the root mesh (the HSDP mesh below,
# and torch's own FSDP and DTensor paths); the slices are the supported form in this version, so a check's 2 x N
# lines of it on stderr tell a user nothing.
warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh", category=UserWarning)


def mesh_layout(plan: Plan) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Axis names and sizes of the mesh, slowest first, following ``plan.rank_order``."""
    sizes = {"pp": plan.pp, "dp_replicate": plan.dp_replicate, "dp_shard": plan.shard_group, "cp": plan.cp,
             "tp": plan.tp}
    names: list[str] = []
    for axis in reversed(plan.rank_order.split("-")):
        if axis == "dp":
            names += ["dp_replicate", "dp_shard"]
        elif axis != "ep":
            names.append(axis)
    return tuple(names), tuple(sizes[n] for n in names)


@dataclass(frozen=True, kw_only=True)
class Meshes:
    """The world mesh plus the flattened sub-meshes the runtime uses."""

    world: DeviceMesh
    """All axes."""
    plan: Plan
    """The plan the mesh was built for."""
    flat: dict[str, DeviceMesh]
    """Flattened 1-D meshes ``dp``, ``dp_shard_cp`` and ``dp_cp``, kept as _flatten returned them."""
    group: object | None = None
    """Process group of the ranks in the mesh when it is a subset of the world (the others idle), else None (the
    whole world)."""

    @property
    def active(self) -> bool:
        """Whether this rank is in the mesh (ranks beyond the plan's GPUs idle until a switch needs them)."""
        return self.world.get_coordinate() is not None

    def axis(self, name: str) -> DeviceMesh:
        """A 1-D sub-mesh: one of MESH_AXES, or a flattened ``dp`` / ``dp_shard_cp`` / ``dp_cp``."""
        return self.flat[name] if name in self.flat else self.world[name]

    def rank_in(self, name: str) -> int:
        """This rank's coordinate along an axis (flattened axes included)."""
        return self.axis(name).get_local_rank()

    @property
    def fsdp(self) -> DeviceMesh | None:
        """The mesh FSDP shards and reduces over: (dp_replicate, dp_shard*cp), or None when dp*cp == 1."""
        if self.plan.dp * self.plan.cp == 1:
            return None
        if self.plan.dp_replicate > 1:
            return self.world["dp_replicate", "dp_shard_cp"]  # the HSDP (replicate, shard) form
        return self.flat["dp_shard_cp"]

    @property
    def tp(self) -> DeviceMesh | None:
        """The tensor-parallel mesh, or None when tp == 1."""
        return self.world["tp"] if self.plan.tp > 1 else None


def build_meshes(plan: Plan, device_type: str) -> Meshes:
    """The plan's mesh in its rank order over the first ``n_gpus`` ranks of the world (the rest idle: a live
    switch can shrink the layout and grow it back), then the data/context axes FSDP and the loss need, flattened.
    Every rank calls it: creating a group is collective over the world."""
    names, sizes = mesh_layout(plan)
    world_size = dist.get_world_size()
    if plan.n_gpus == world_size:
        world, group = init_device_mesh(device_type, sizes, mesh_dim_names=names), None
    else:
        world = DeviceMesh(device_type, torch.arange(plan.n_gpus).reshape(sizes), mesh_dim_names=names)
        group = dist.new_group(list(range(plan.n_gpus)))
    flat = {}
    for name, parts in (("dp", ("dp_replicate", "dp_shard")), ("dp_shard_cp", ("dp_shard", "cp")),
                        ("dp_cp", ("dp_replicate", "dp_shard", "cp"))):
        dims = tuple(sorted(parts, key=names.index))
        if world.get_coordinate() is None:
            _idle_flatten(world, dims, name)
        else:
            flat[name] = world[dims]._flatten(name)
    return Meshes(world=world, plan=plan, flat=flat, group=group)


def _idle_flatten(world: DeviceMesh, dims: tuple[str, ...], name: str) -> None:
    """On a rank outside the mesh, create the groups ``world[dims]._flatten(name)`` creates on the others: the
    same ``_init_process_groups`` call as torch 2.13 ``device_mesh.py::_create_flatten_mesh`` (a slice, and a
    DeviceMesh built on it, need a member rank when several slices exist; group creation needs every rank of the
    world, in the same order)."""
    from torch.distributed._mesh_layout import _MeshLayout

    layout = _MeshLayout([world._get_slice_mesh_layout(dims).collapse()])
    DeviceMesh._init_process_groups(layout, world._rank_map, (name,), ((None, None),))


def device_for(local_rank: int) -> torch.device:
    """CUDA device of this local rank when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
