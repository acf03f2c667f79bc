"""The plan schema: Workload, Plan, Cluster and the RunSpec that binds them."""

from collect.schema.checks import RunSpec, collect_problems, plan_problems
from collect.schema.choices import (
    CONVENTIONS,
    DTYPE_BYTES,
    FAMILIES,
    FLOAT8_SCALINGS,
    FRAMEWORKS,
    PIPELINE_SCHEDULES,
    RECOMPUTES,
    SHARDINGS,
    DType,
    Family,
    Float8,
    Framework,
    PipelineSchedule,
    Recompute,
    Sharding,
    framework_conventions,
)
from collect.schema.plan import Cluster, Network, Plan
from collect.schema.workload import Workload

__all__ = [
    "CONVENTIONS",
    "DTYPE_BYTES",
    "FAMILIES",
    "FLOAT8_SCALINGS",
    "FRAMEWORKS",
    "PIPELINE_SCHEDULES",
    "RECOMPUTES",
    "SHARDINGS",
    "Cluster",
    "Network",
    "DType",
    "Family",
    "Float8",
    "Framework",
    "PipelineSchedule",
    "Recompute",
    "Sharding",
    "Plan",
    "RunSpec",
    "Workload",
    "collect_problems",
    "framework_conventions",
    "plan_problems",
]
