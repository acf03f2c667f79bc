"""RunSpec binds a workload, a plan and a cluster, and checks them together.

Every cross-field check is here, in one place (like torchtitan's
``ParallelDims._validate``), and each message shows its arithmetic.
``plan_problems``: what makes a combination impossible. ``collect_problems``:
what the collector cannot measure (predicted only), with the reason.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import model_validator

from collect.schema.choices import Strict
from collect.schema.plan import CLUSTER_LATER_FIELDS, MAX_STAGES, Cluster, Plan
from collect.schema.plan import LATER_FIELDS as PLAN_LATER_FIELDS
from collect.schema.workload import LATER_FIELDS, Workload

# Fields added after data was collected: left out of a run id at their defaults, so every earlier id still holds.
# the plan's conventions the collector does not run: a plan with any of them is predicted, not measured
PREDICTED_ONLY = (
    "sequence_parallel_regather fp32_master_weights fp32_grads grad_accumulation_pass float8_params "
    "attention_keeps_packed_qkv tp_layer_latency grad_reduce_overlap param_gather_overlap tp_comm_overlap"
).split()
_LATER_FIELDS = {
    "workload": {k: Workload.model_fields[k].default for k in LATER_FIELDS},
    "plan": {k: Plan.model_fields[k].default for k in PLAN_LATER_FIELDS},
    "cluster": {k: Cluster.model_fields[k].default for k in CLUSTER_LATER_FIELDS},
}


class RunSpec(Strict):
    """One (workload, plan, cluster) point: the unit that is measured and predicted."""

    workload: Workload
    plan: Plan
    cluster: Cluster

    @model_validator(mode="after")
    def _validate(self) -> "RunSpec":
        problems = plan_problems(self.workload, self.plan, self.cluster)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def run_id(self) -> str:
        """Stable content hash: identical specs get identical ids on any machine."""
        dump = self.model_dump(mode="json")
        for part, defaults in _LATER_FIELDS.items():
            dump[part] = {k: v for k, v in dump[part].items() if k not in defaults or v != defaults[k]}
        canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def plan_problems(w: Workload, p: Plan, c: Cluster) -> list[str]:
    """Every reason this combination cannot run, each naming fields and arithmetic."""
    problems = []
    if p.world_size != c.world_size:
        problems.append(
            f"plan.dp ({p.dp}) * plan.cp ({p.cp}) * plan.tp ({p.tp}) * plan.pp ({p.pp}) = {p.world_size} != "
            f"cluster world size nodes ({c.nodes}) * devices_per_node ({c.devices_per_node}) = {c.world_size}"
        )
    problems += _tp_problems(w, p)
    problems += _pp_problems(w, p)
    problems += _cp_problems(w, p)
    problems += _ep_problems(w, p)
    problems += _float8_problems(w, p, c)
    samples = p.dp * w.micro_batch_size * p.num_microbatches
    if samples != w.global_batch_size:
        problems.append(
            f"workload.global_batch_size ({w.global_batch_size}) != plan.dp ({p.dp}) * "
            f"workload.micro_batch_size ({w.micro_batch_size}) * plan.num_microbatches "
            f"({p.num_microbatches}) = {samples}"
        )
    half = [f"plan.{k}" for k in ("fp32_master_weights", "fp32_grads") if getattr(p, k)]
    if half and w.dtype not in ("bfloat16", "float16"):
        problems.append(f"{' and '.join(half)} need a 2-byte workload.dtype (bfloat16 or float16), not {w.dtype!r}")
    if p.sequence_parallel_regather and not p.sequence_parallel:
        problems.append("plan.sequence_parallel_regather needs plan.sequence_parallel")
    if p.tp_comm_overlap and not (p.tp_enabled and p.sequence_parallel):  # it overlaps SP's collectives
        problems.append("plan.tp_comm_overlap needs plan.tp > 1 with plan.sequence_parallel")
    if w.dtype == "float16" and c.device == "cpu":
        problems.append("workload.dtype 'float16' is not supported for training on device 'cpu'; use bfloat16")
    return problems


def _tp_problems(w: Workload, p: Plan) -> list[str]:
    problems = []
    widths = [("heads", w.heads), ("hidden", w.hidden), ("vocab", w.vocab)]
    if w.family != "gpt":  # Megatron and torchtitan split key/value heads, never share one over tp ranks
        widths += [("kv_heads", w.n_kv_heads), ("ffn_hidden", w.dense_ffn)]
    for name, value in widths:
        if value % p.tp:
            problems.append(
                f"workload.{name} ({value}) must be divisible by plan.tp ({p.tp}): {value} % {p.tp} = {value % p.tp}"
            )
    etp = p.expert_tp  # experts split over tp like a dense MLP unless plan.etp says otherwise
    if w.family == "moe" and w.expert_ffn_hidden % etp:
        by = f"plan.etp ({etp})" if p.etp else f"plan.tp ({etp}) (plan.etp unset)"
        problems.append(
            f"workload.expert_ffn_hidden ({w.expert_ffn_hidden}) must be divisible by {by}: "
            f"{w.expert_ffn_hidden} % {etp} = {w.expert_ffn_hidden % etp}"
        )
    if p.sequence_parallel and not p.tp_enabled:
        problems.append("plan.sequence_parallel needs plan.tp > 1")
    if p.sequence_parallel and w.seq_len % p.tp:
        problems.append(f"workload.seq_len ({w.seq_len}) must be divisible by plan.tp ({p.tp}) with sequence_parallel")
    return problems


def _pp_problems(w: Workload, p: Plan) -> list[str]:
    problems = []
    if not p.pp_enabled:
        if p.pp_schedule is not None:
            problems.append(f"plan.pp_schedule ({p.pp_schedule!r}) needs plan.pp > 1; leave it unset when pp = 1")
        if p.virtual_stages != 1:
            problems.append(f"plan.virtual_stages ({p.virtual_stages}) needs plan.pp > 1")
        return problems
    interleaved = p.interleaved
    if interleaved and p.virtual_stages < 2:
        problems.append(f"plan.pp_schedule 'interleaved_1f1b' needs plan.virtual_stages >= 2, got {p.virtual_stages}")
    if not interleaved and p.virtual_stages != 1:
        problems.append(f"plan.virtual_stages ({p.virtual_stages}) > 1 needs pp_schedule 'interleaved_1f1b'")
    if p.num_stages > MAX_STAGES:  # before listing each stage's layers
        return problems + [
            f"plan.pp ({p.pp}) * plan.virtual_stages ({p.virtual_stages}) = {p.num_stages} pipeline stages is over "
            f"the limit of {MAX_STAGES}"
        ]
    counts = p.stage_layers(w.layers, w.pipeline_costs)
    # the first and last stages hold the embedding and the head even without a layer; a middle one would be empty
    # (Nanotron's split by weights leaves stages past the layers empty, and runs them)
    middle = 1 if p.pipeline_split == "weights" else min(counts[1:-1], default=1)
    if min(counts[0], counts[-1]) < 0 or middle < 1:
        problems.append(
            f"workload.layers ({w.layers}) leaves a pipeline stage empty over plan.pp ({p.pp}) * "
            f"plan.virtual_stages ({p.virtual_stages}) = {p.num_stages} stages: {list(counts)} (Plan.stage_layers "
            "counts the embedding and the loss as a layer each when the layers do not divide evenly)"
        )
    if interleaved and p.num_microbatches % p.pp:
        problems.append(
            f"plan.pp_schedule 'interleaved_1f1b' needs plan.num_microbatches ({p.num_microbatches}) "
            f"divisible by plan.pp ({p.pp}): {p.num_microbatches} % {p.pp} = {p.num_microbatches % p.pp}"
        )
    return problems


def _cp_problems(w: Workload, p: Plan) -> list[str]:
    if not p.cp_enabled:
        return []
    # the ring balances causal attention by giving each rank two of 2 x cp chunks (first and last)
    chunks = 2 * p.cp * (p.tp if p.sequence_parallel else 1)
    if w.seq_len % chunks == 0:
        return []
    by = f"2 * plan.cp ({p.cp})" + (f" * plan.tp ({p.tp}) with sequence_parallel" if p.sequence_parallel else "")
    return [
        f"workload.seq_len ({w.seq_len}) must be divisible by {by} = {chunks}: {w.seq_len} % {chunks} = "
        f"{w.seq_len % chunks}"
    ]


def _ep_problems(w: Workload, p: Plan) -> list[str]:
    if p.etp is not None and w.family != "moe":
        return [f"plan.etp ({p.etp}) needs a mixture-of-experts workload (family 'moe'), not {w.family!r}"]
    if not p.ep_enabled and (p.etp or p.tp) == p.tp:
        return []
    if w.family != "moe":
        return [f"plan.ep ({p.ep}) > 1 needs a mixture-of-experts workload (family 'moe'), not {w.family!r}"]
    problems = []
    if w.experts % p.ep:
        problems.append(
            f"workload.experts ({w.experts}) must be divisible by plan.ep ({p.ep}): {w.experts} % {p.ep} = "
            f"{w.experts % p.ep}"
        )
    ranks, etp = p.dp * p.cp * p.tp, p.expert_tp
    if ranks % (p.ep * etp):
        problems.append(
            f"plan.ep ({p.ep}) * plan.etp ({etp}) = {p.ep * etp} must divide the ranks it borrows from, plan.dp "
            f"({p.dp}) * plan.cp ({p.cp}) * plan.tp ({p.tp}) = {ranks}: {ranks} % {p.ep * etp} = {ranks % (p.ep * etp)}"
        )
    return problems


def _float8_problems(w: Workload, p: Plan, c: Cluster) -> list[str]:
    problems = []
    if w.float8 != "none" and c.device == "cpu":
        problems.append(f"workload.float8 ({w.float8!r}) needs GPUs with FP8 matmuls (H100, H200, B200), not 'cpu'")
    if p.float8_params and (w.float8 == "none" or not p.fp32_master_weights):
        problems.append(f"plan.float8_params needs a workload.float8 format and plan.fp32_master_weights ({w.float8})")
    if p.float8_all_gather and not (w.float8 == "tensorwise" and p.fsdp_enabled):
        problems.append(
            "plan.float8_all_gather needs workload.float8 'tensorwise' and an FSDP sharding "
            f"(got float8 {w.float8!r}, sharding {p.sharding!r})"
        )
    return problems


def collect_problems(w: Workload, p: Plan, c: Cluster) -> list[str]:
    """What the collector cannot measure, on any machine, though the plan can be predicted: each with why."""
    problems = []
    if w.family == "moe" and p.tp_enabled:
        problems.append(
            f"plan.tp ({p.tp}) with family 'moe' is predicted only: the collector's experts have no tensor-parallel "
            "split (torchtitan's ETP) yet"
        )
    if w.tied_embeddings and p.pp_enabled:
        problems.append(
            f"workload.tied_embeddings with plan.pp ({p.pp}) is predicted only: the collector's pipeline stages do not "
            "share the first stage's embedding with the last stage's head (torchtitan refuses it too)"
        )
    if p.cp_enabled:
        # checked on gloo ranks: context_parallel's ring has no rule for the CPU attention kernel
        problems.append(
            f"plan.cp ({p.cp}) is predicted only: torch's context_parallel cannot shard CPU attention "
            "(aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy in torch 2.13), and the "
            "collector does not apply it on GPUs yet"
        )
    if p.ep_enabled and not p.fsdp_enabled:
        problems.append(
            f"plan.ep ({p.ep}) with plan.sharding {p.sharding!r} is predicted only: the collector shards experts "
            "with FSDP2 (fsdp_grad_op, fsdp_full), as torchtitan does"
        )
    if p.ep_enabled and p.recompute == "selective":
        # tried on gloo ranks: the experts' own FSDP hooks run a different number of ops when the block is recomputed
        problems.append(
            f"plan.ep ({p.ep}) with plan.recompute 'selective' is predicted only: torch 2.13's selective checkpointing "
            "refuses the experts' nested FSDP hooks on recompute (an op count differs between forward and recompute)"
        )
    problems += _collect_workload_problems(w, p, c)
    if w.float8 != "none":
        problems.append(
            f"workload.float8 ({w.float8!r}) is predicted only: the collector has no FP8 training path "
            "(no FP8 hardware to check it on)"
        )
    return problems + _collect_plan_problems(w, p)


def _collect_plan_problems(w: Workload, p: Plan) -> list[str]:
    """Plans Megatron runs that torch's own APIs, which the collector uses, do not."""
    problems = []
    counts = p.stage_layers(w.layers, w.pipeline_costs)
    if min(counts) < 1:
        # keeps every sweep's space as it was before such plans were accepted (resumed sweeps draw the same points)
        problems.append(
            f"workload.layers ({w.layers}) over {p.num_stages} stages leaves a first or last stage with no layer "
            f"({list(counts)}): predicted only, the collector's stages each hold at least one block"
        )
    if p.sharding == "none" and p.tp_enabled and p.dp_enabled:
        problems.append(
            f"plan.sharding 'none' (DDP) with plan.tp ({p.tp}) and plan.dp ({p.dp}) is predicted only: torch's "
            "DistributedDataParallel cannot hold DTensor parameters (Megatron's own DDP can; torchtitan refuses it)"
        )
    if p.sharding == "zero1" and p.tp_enabled:
        problems.append(
            f"plan.sharding 'zero1' with plan.tp ({p.tp}) is predicted only: torch's ZeroRedundancyOptimizer cannot "
            "hold DTensor parameters (Megatron's distributed optimizer can)"
        )
    if p.loss_parallel and p.tp_enabled and p.pp_enabled:
        problems.append(
            f"plan.loss_parallel with plan.tp ({p.tp}) and plan.pp ({p.pp}) is predicted only: the collector's "
            "pipeline stages pass plain tensors, so its last stage's head gathers whole logits"
        )
    kept = [f"plan.{k}" for k in PREDICTED_ONLY if getattr(p, k)]
    kept += ["plan.pipeline_holds_buffers false"] if p.pp_enabled and not p.pipeline_holds_buffers else []
    kept += ["plan.pipeline_split 'weights'"] if p.pp_enabled and p.pipeline_split == "weights" else []
    kept += ["plan.attention 'eager'"] if p.attention == "eager" else []
    kept += [f"plan.attention_kernel {p.attention_kernel!r}"] if p.attention_kernel != "sdpa" else []
    kept += ["plan.moe_dispatcher 'hybrid'"] if p.moe_dispatcher == "hybrid" else []
    kept += [f"plan.optimizer_state_dtype {p.optimizer_state_dtype!r}"] if p.optimizer_state_dtype else []
    if kept:
        problems.append(
            f"{', '.join(kept)}: predicted only, the collector runs torch's conventions (DTensor saves gathered "
            "inputs; pipelining holds its buffers per micro-batch and splits by layers; weights, gradients and "
            "their reduction stay in the workload's dtype; attention runs torch's fused SDPA, keeping q, k and v once; "
            "AdamW's moments as torch keeps them; experts reached by a plain all-to-all)"
        )
    if p.pp_schedule == "1f1b" and p.num_microbatches < p.pp:
        problems.append(
            f"plan.pp_schedule '1f1b' with plan.num_microbatches ({p.num_microbatches}) < plan.pp ({p.pp}) is "
            "predicted only: torch's Schedule1F1B refuses it (Megatron runs it as a pipeline that never fills)"
        )
    return problems


def _collect_workload_problems(w: Workload, p: Plan, c: Cluster) -> list[str]:
    """Model and plan features the collector's models and parallelisms do not implement yet."""
    qk = (w.qk_nope_head_dim or 0) + (w.qk_rope_head_dim or 0)
    unfused = w.mla and c.device == "cpu" and w.v_head_dim != qk  # torch 2.13's CPU SDPA then keeps the scores
    said = {
        f"workload.v_head_dim ({w.v_head_dim}) other than qk_nope_head_dim + qk_rope_head_dim ({qk}) is predicted "
        "only on CPU: torch's CPU attention runs it unfused": unfused,
        f"workload.kv_lora_rank (multi-head latent attention) with plan.tp ({p.tp}) is predicted only: the "
        "collector's tensor-parallel plan does not split MLA's up-projections": w.mla and p.tp_enabled,
        "workload.sliding_window is predicted only: the collector's attention has no sliding window": w.sliding_layers,
        f"plan.etp ({p.etp}) other than plan.tp ({p.tp}) is predicted only: experts are not split": p.expert_tp != p.tp,
    }
    return [problem for problem, applies in said.items() if applies]
