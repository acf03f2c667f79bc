"""Request and response models of the service, built on the plan schema (collect.schema).

The same models validate the CLI's SPEC.json and the HTTP bodies, and give
the OpenAPI schema. Every problem is reported with the field it concerns:
``plans[3]: plan.dp (2) * plan.tp (2) ... != cluster world size ...``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from collect.hardware.records import default_hardware_dir, load_hardware
from collect.schema import Cluster, Network, Plan, RunSpec, Workload, plan_problems
from collect.schema.choices import FLOAT8_SCALINGS, Float8, Framework, gemm_rate_key
from gnn.inference.cost import explain_cost, over_budget, request_cost
from gnn.inference.predictor import FITS_MAX_RISK
from gnn.inference.probe import check_probe, hardware_kind

MAX_PLANS = 10_000  # per request: a search batch
MAX_PARAMS = 2 * 10**12  # model size limit (2T parameters)
MAX_WORLD_SIZE = 16_384  # GPU count limit
MAX_SEARCH_TRIALS = 5_000
MAX_STAGES = 256  # pp * virtual_stages of one plan
MAX_MICROBATCHES = 65_536  # of one plan
# Beyond these, what a request may cost as a whole: gnn.inference.cost estimates its time and memory from the
# plans' pipeline shapes (REQUEST_SECONDS, REQUEST_BYTES) and refuses it before any work when over.


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClusterSpec(_Request, Network):
    """A cluster: a datasheet preset (e.g. a100-80gb) or a measured fingerprint, its size, and its network where it
    is not a node of NVLink with a NIC per GPU (collect.schema.plan.Network)."""

    preset: str | None = None
    """Hardware preset (v100-16gb, a100-40gb, a100-80gb, h100-80gb, b200-180gb, b300-288gb, gb200-nvl72,
    gb300-nvl72): fills device, memory and links."""
    fingerprint: str | None = None
    """Id of a measured fingerprint in data/hardware (what `make collect` records), instead of a preset."""
    nodes: int = Field(default=1, ge=1)
    devices_per_node: int | None = Field(default=None, ge=1, le=64)
    memory_bytes: int | None = Field(default=None, ge=1)
    """Per-device capacity; defaults to the preset's."""

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        if (self.preset is None) == (self.fingerprint is None):
            raise ValueError("cluster: give exactly one of 'preset' (e.g. \"a100-80gb\") or 'fingerprint'")
        if self.preset is not None:
            record = load_hardware(self.preset)  # ValueError naming the known presets
            if record.get("source") != "datasheet":
                raise ValueError(f"cluster.preset {self.preset!r} is not a preset")
        elif self.devices_per_node is None or self.memory_bytes is None:
            raise ValueError("cluster: with a fingerprint, give devices_per_node and memory_bytes")
        if self.world_size > MAX_WORLD_SIZE:
            per_node = self.world_size // self.nodes
            raise ValueError(
                f"cluster: nodes ({self.nodes}) * devices_per_node ({per_node}) = "
                f"{self.world_size} devices is over the limit of {MAX_WORLD_SIZE}"
            )
        return self

    @cached_property
    def _preset(self) -> dict:
        return load_hardware(self.preset) if self.preset else {}

    @property
    def record(self) -> dict:
        """The hardware record: the preset's, or the fingerprint's (UnknownHardware if there is none)."""
        return self._preset if self.preset else load_hardware(self.fingerprint, default_hardware_dir())

    @property
    def float8_choices(self) -> tuple[str, ...]:
        """The workload.float8 settings the preset's GPUs run: FP8 scalings with a datasheet FP8 peak, each
        block-scaled format with its own (Blackwell's MXFP8 and NVFP4); 'none' always."""
        peaks = self._preset.get("peak_flops_per_s", {})
        return tuple(f for f in FLOAT8_SCALINGS if f == "none" or gemm_rate_key(f) in peaks)

    @property
    def world_size(self) -> int:
        return self.nodes * (self.devices_per_node or self._preset.get("devices_per_node", 8))

    def hardware_name(self) -> str:
        return self.preset or self.fingerprint

    def cluster(self) -> Cluster:
        network = {k: getattr(self, k) for k in Network.model_fields}
        if self.preset:
            p = self._preset
            return Cluster(
                nodes=self.nodes,
                devices_per_node=self.devices_per_node or p["devices_per_node"],
                device="cuda",
                device_kind=p["id"],
                memory_bytes=self.memory_bytes or p["memory_bytes"],
                backend="nccl",
                **network,
            )
        return Cluster(
            nodes=self.nodes, devices_per_node=self.devices_per_node, memory_bytes=self.memory_bytes, **network
        )


def limit_problems(plan: Plan) -> list[str]:
    """What makes one plan too large to predict within the service's time and memory bounds."""
    problems = []
    if plan.num_stages > MAX_STAGES:
        problems.append(
            f"plan.pp ({plan.pp}) * plan.virtual_stages ({plan.virtual_stages}) = {plan.num_stages} "
            f"pipeline stages is over the limit of {MAX_STAGES}"
        )
    if plan.num_microbatches > MAX_MICROBATCHES:
        problems.append(f"plan.num_microbatches ({plan.num_microbatches}) is over the limit of {MAX_MICROBATCHES}")
    return problems


def _check_workload(w: Workload, cluster: ClusterSpec) -> None:
    if w.num_params > MAX_PARAMS:
        raise ValueError(f"workload: {w.num_params:.3g} parameters is over the limit of {MAX_PARAMS:.3g}")
    if cluster.preset and w.float8 not in cluster.float8_choices:
        raise ValueError(
            f"workload.float8 ({w.float8!r}) needs GPUs whose tensor cores run it (FP8: H100, H200, Blackwell; "
            f"mxfp8 and nvfp4: Blackwell); cluster.preset {cluster.preset!r} runs {list(cluster.float8_choices)}"
        )


class PredictRequest(_Request):
    workload: Workload
    cluster: ClusterSpec
    plans: list[Plan] = Field(min_length=1, max_length=MAX_PLANS)
    probe: str | None = Field(default=None, max_length=100)
    """Name of a probe measured on this machine (`python -m collect probe` prints it; its rows in data/runs): the
    times are corrected by what its runs showed, and their intervals widened by how sure that correction is. A
    probe holds at most 32 runs, all on the cluster's kind of device."""
    probe_any_hardware: bool = False
    """Apply a probe measured on another kind of device than the cluster's anyway."""

    @model_validator(mode="after")
    def _check(self) -> "PredictRequest":
        _check_workload(self.workload, self.cluster)
        if self.probe is not None:  # before any work: ValueError naming the probe field
            check_probe(self.probe, hardware_kind(self.cluster.record), self.probe_any_hardware)
        cluster = self.cluster.cluster()
        problems = [
            f"plans[{i}]: {msg}"
            for i, p in enumerate(self.plans)
            for msg in limit_problems(p) or plan_problems(self.workload, p, cluster)
        ]
        if not problems and (why := over_budget(request_cost(self.plans))):
            problems.append(f"plans: {why}")
        if problems:
            shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
            raise ValueError("; ".join(shown))
        return self

    def specs(self) -> list[RunSpec]:
        cluster = self.cluster.cluster()
        return [RunSpec.model_construct(workload=self.workload, plan=p, cluster=cluster) for p in self.plans]


class ExplainRequest(PredictRequest):
    """One plan to take apart (POST /explain): predicted, simulated again for its memory per rank, and its first
    pipeline ranks drawn as a timeline, all estimated against the request budget (gnn.inference.cost.explain_cost)."""

    plans: list[Plan] = Field(min_length=1, max_length=1)

    @model_validator(mode="after")
    def _check_explained(self) -> "ExplainRequest":
        if why := over_budget(explain_cost(self.plans[0])):
            raise ValueError(f"plans: taking a plan apart simulates it again and draws it: {why}")
        return self


class PlanPrediction(BaseModel):
    iter_time_s: float
    iter_time_interval_s: tuple[float, float]
    """80% prediction interval (calibrated on held-out measurements)."""
    peak_mem_bytes: float
    """Peak memory per device (the busiest device), as allocated to tensors: torch.cuda.max_memory_allocated, the
    number frameworks log. The device holds more (the caching allocator's reserve, CUDA's context), which fits and
    oom_risk add (collect.fake.device)."""
    peak_mem_interval_bytes: tuple[float, float]
    fits: bool
    """oom_risk at most 0.1 (gnn.inference.predictor.FITS_MAX_RISK): the whole 80% memory interval, with what the
    device holds beyond its tensors, is within the device's capacity. The search picks by the same rule (its
    max_oom_risk, 0.1 by default)."""
    oom_risk: float
    """The chance the peak exceeds the device's memory, read from the memory interval (its upper end is the 90th
    percentile): below 0.1 when the whole interval fits. The search picks only plans under its max_oom_risk."""
    breakdown: dict[str, float]
    """Shares of the busiest device's iteration, per the simulator: compute, exposed communication, bubble."""
    extrapolation: list[str] | None = None
    """What of this plan lies outside the measured runs the model was trained on, on this GPU (e.g. "num_params
    8e+10 above the largest trained on h100, 3.57e+09"), then what lies outside only the runs that measured a peak
    ("peak memory: ..."); empty when every quantity is inside. Out there the answer leans on physics and its error
    is larger (docs/accuracy.md). None: the model records no training range."""


class PredictResponse(BaseModel):
    model: dict
    predictions: list[PlanPrediction]
    probe: dict | None = None
    """The probe's correction, when the request named one: its runs, the time factor applied and its log sd."""
    compute_pricing: str | None = None
    """What the simulator priced compute from on this cluster: a kernel table measured on its GPU (and what it
    lacked, taken from the datasheet), the datasheet alone, or a measured fingerprint's block profile."""
    calibration: str | None = None
    """Which calibration the 80% intervals took: "leave-one-source-out" on a GPU cluster (how wrong the model was on
    whole sources it never trained on, moved by a probe if one is named) or "in-distribution" (validation runs
    beside the training runs: CPU plans, or a model saved without the former)."""


class SearchRequest(_Request):
    """Search the plans of a workload (its global_batch_size fixed; micro_batch_size is searched) on a cluster."""

    workload: Workload
    cluster: ClusterSpec
    objective: Literal["time", "pareto"] = "time"
    """time: fastest plan that fits; pareto: time vs peak memory (NSGA-II)."""
    trials: int = Field(default=200, ge=1, le=MAX_SEARCH_TRIALS)
    top_k: int = Field(default=5, ge=1, le=100)
    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Sampler seed (numpy's range)."""
    micro_batch_sizes: tuple[Annotated[int, Field(ge=1, le=2**20)], ...] = Field(
        default=(1, 2, 4, 8), min_length=1, max_length=16
    )
    sampler: Literal["auto", "optuna", "exhaustive"] = "auto"
    """auto: every plan of the space when it has at most `trials` plans (the exact optimum within the budget),
    else Optuna (TPE for time, NSGA-II for pareto); optuna or exhaustive force one."""
    max_oom_risk: float = Field(default=FITS_MAX_RISK, ge=0.0, le=1.0)
    """The largest chance of running out of memory (a prediction's oom_risk) a plan may carry to be picked: the
    default takes only plans whose 80% memory interval fits, so whose upper end is below capacity."""
    time_quantile: float = Field(default=0.5, ge=0.1, le=0.9)
    """The quantile of each plan's predicted time the search ranks by: 0.5 (the default) its point; 0.9 the time it
    beats 9 runs in 10 (its 80% interval's upper end), which prefers the plans the model is surer of."""
    framework: Framework = "torch"
    """The framework that will run the plan: its conventions (vocabulary-parallel loss, what a pipeline keeps, how
    sequence parallelism saves inputs, fp32 master weights and gradients) change the memory each plan needs, and
    its overlaps the time (collect.schema.framework_conventions). torch is the local collector's; megatron is
    Megatron-LM's defaults; nemo is NeMo's and Megatron-Bridge's recipes (Megatron's, with tensor parallelism's
    collectives overlapped with the GEMMs)."""

    @model_validator(mode="after")
    def _check(self) -> "SearchRequest":
        _check_workload(self.workload, self.cluster)
        return self


class SearchResult(BaseModel):
    plan: Plan
    micro_batch_size: int
    float8: Float8 = "none"
    """The precision the search chose for the workload's GEMMs (none: the workload's dtype throughout)."""
    prediction: PlanPrediction
    ranked_time_s: float | None = None
    """The plan's time at the request's time_quantile: what it was ranked by (beside its oom_risk)."""


class SearchResponse(BaseModel):
    model: dict
    objective: str
    sampler: str = "optuna"
    """How the plans were chosen: exhaustive (every plan of the space) or optuna."""
    trials: int
    """Trials evaluated (complete, or pruned as invalid); trials a killed run left behind were evaluated again."""
    distinct_plans: int = 0
    """Different plans among them (samplers revisit good plans)."""
    feasible_trials: int
    space_size: int
    best: list[SearchResult]
    pareto: list[SearchResult] = []
    precisions: list[Float8] = []
    """The GEMM precisions searched (bfloat16 as 'none'); empty: the workload's own, not searched."""
    moe: bool = False
    """The workload is a mixture of experts: each plan names its ep and etp."""
    space_size_exact: bool = True
    """False: space_size and over_budget_plans are estimated from a seeded sample of the space, which has too many
    candidates to count within the search's budget."""
    over_budget_plans: int | None = None
    """Plans of the space left out of the search because predicting one alone is over the service's budget for a
    request (POST /predict would refuse it): pipelines of hundreds of stages and micro-batches."""
    stopped_by: Literal["budget"] | None = None
    """budget: the search stopped at its budget (docs/service.md, limits) before its trials were all evaluated; its
    plans are the best of those it evaluated. None: it ran to the end."""
    stop_reason: str | None = None
    """Why it stopped, with what it had spent."""
    estimate: dict | None = None
    """What the search was estimated to cost before it ran (serve.search.budget): seconds of work, bytes, plans."""
