"""The device mesh of a plan: (pp, dp, tp), or (pp, dp_mod_ep, ep, tp) under expert parallelism.

Axis order follows torchtitan: tp innermost so tensor-parallel groups are the
closest ranks (same node on GPU clusters), pp outermost. Expert parallelism
borrows its ranks from dp (torchtitan's dp_shard_in_ep): dp splits into the
ep ranks that share one replica's experts and the dp / ep replicas of them,
and the two flatten back into "dp" for everything that is not an expert.
"""

from __future__ import annotations

from functools import lru_cache

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from collect.schema import Plan

MESH_AXES = ("pp", "dp", "tp")
EP_MESH_AXES = ("pp", "dp_mod_ep", "ep", "tp")


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    return _mesh_for_layout(plan.pp, plan.dp, plan.tp, plan.ep, device_type)


# NOTE: one mesh per layout for the life of a rank. DeviceMesh caches its
# sub-groups by layout, so destroying a plan's groups breaks the next plan with
# the same layout ("could not resolve process group"); a world size has only a
# handful of layouts, so keeping them costs little and saves group set-up per plan.
@lru_cache(maxsize=None)
def _mesh_for_layout(pp: int, dp: int, tp: int, ep: int, device_type: str) -> DeviceMesh:
    if ep == 1:
        return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=MESH_AXES)
    mesh = init_device_mesh(device_type, (pp, dp // ep, ep, tp), mesh_dim_names=EP_MESH_AXES)
    mesh["dp_mod_ep", "ep"]._flatten("dp")
    return mesh
