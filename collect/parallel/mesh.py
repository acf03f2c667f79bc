"""The (pp, dp, tp) device mesh of a plan.

Axis order follows torchtitan: tp innermost so tensor-parallel groups are the
closest ranks (same node on GPU clusters), pp outermost.
"""

from __future__ import annotations

from functools import lru_cache

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from collect.schema import Plan

MESH_AXES = ("pp", "dp", "tp")


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    return _mesh_for_layout(plan.pp, plan.dp, plan.tp, device_type)


# NOTE: one mesh per layout for the life of a rank. DeviceMesh caches its
# sub-groups by layout, so destroying a plan's groups breaks the next plan with
# the same layout ("could not resolve process group"); a world size has only a
# handful of layouts, so keeping them costs little and saves group set-up per plan.
@lru_cache(maxsize=None)
def _mesh_for_layout(pp: int, dp: int, tp: int, device_type: str) -> DeviceMesh:
    return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=MESH_AXES)
