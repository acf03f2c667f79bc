"""The plan schema: Workload, Plan, Cluster and the RunSpec that binds them."""

from collect.schema.checks import RunSpec, collect_problems, plan_problems
from collect.schema.choices import (
    DTYPE_BYTES,
    FAMILIES,
    FLOAT8_SCALINGS,
    PIPELINE_SCHEDULES,
    RECOMPUTES,
    SHARDINGS,
    DType,
    Family,
    Float8,
    PipelineSchedule,
    Recompute,
    Sharding,
)
from collect.schema.plan import Cluster, Plan
from collect.schema.workload import Workload

__all__ = [
    "DTYPE_BYTES",
    "FAMILIES",
    "FLOAT8_SCALINGS",
    "PIPELINE_SCHEDULES",
    "RECOMPUTES",
    "SHARDINGS",
    "Cluster",
    "DType",
    "Family",
    "Float8",
    "PipelineSchedule",
    "Recompute",
    "Sharding",
    "Plan",
    "RunSpec",
    "Workload",
    "collect_problems",
    "plan_problems",
]
