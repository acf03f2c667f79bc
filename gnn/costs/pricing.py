"""What a node of the execution graph costs in seconds: collectives from the hardware's curves (or NCCL's model on a
preset), compute from the block profile where the hardware has one, kernel by kernel on a GPU preset
(gnn.costs.gpu), else from FLOPs at its throughput; the optimizer step per tensor, or by bytes on a GPU.

One Pricing per plan (gnn.graph.passes asks it for every node it writes); each
distinct node is priced once.
"""

from __future__ import annotations

from collect.schema import Plan, Workload
from collect.schema.choices import gemm_rate_key
from gnn.costs.analytic import FP32_BYTES, BlockCosts, block_features, dtype_bytes
from gnn.costs.collectives import dispatch_remote_share
from gnn.costs.gpu import KERNELS, Rate, forward_seconds, linear_seconds
from gnn.costs.hardware import HardwareModel

# the collective each communication node runs (the node kinds of gnn.graph.table); tp_comm's depends on
# sequence parallelism
COLLECTIVE = {
    "tp_comm": None,
    "dp_comm": "all_reduce",
    "fsdp_allgather": "all_gather",
    "fsdp_reducescatter": "reduce_scatter",
    "zero_allgather": "all_gather",
    "p2p": "send_recv",
    "ep_a2a": "all_to_all",
    "cp_ring": "send_recv",
}
# parameter tensors of one GPT layer: two norms (weight, bias) and six linears (weight, bias); the first stage
# adds 2 (token and position embeddings), the last 3 (the final norm's two, the output projection)
TENSORS_PER_LAYER = 16
# the kinds whose group is strided by tp in the rank order (tp innermost): a node holds devices_per_node / tp of them
STRIDED_BY_TP = {"dp_comm", "fsdp_allgather", "fsdp_reducescatter", "zero_allgather", "cp_ring"}


def network(cluster, hw: HardwareModel) -> tuple[int, float | None]:
    """(ranks per NVLink domain, bytes/s of network per device) of a cluster: its own where it states them
    (collect.schema.Cluster's nvlink_domain, nics_per_node, nic_bandwidth_bytes_per_s), else the hardware's
    (None: the record's inter-node bandwidth, one NIC per device)."""
    nics, nic = cluster.nics_per_node, cluster.nic_bandwidth_bytes_per_s
    per_device = None
    if nics is not None or nic is not None:
        per_device = (nics or cluster.devices_per_node) * (nic or hw.inter_bw or 0.0) / cluster.devices_per_node
    return cluster.nvlink_ranks, per_device or None


class Pricing:
    def __init__(
        self,
        w: Workload,
        plan: Plan,
        c: BlockCosts,
        hw: HardwareModel,
        stage_layers: tuple[int, ...],
        tp_cross: bool,
        network: tuple[int, float | None] | None = None,
    ):
        """``stage_layers``: each stage's layer count (Plan.stage_layers); ``network``: the cluster's (see
        network()), else the hardware record's."""
        self.w, self.plan, self.c, self.hw = w, plan, c, hw
        self.domain, self.inter_bw = network or (hw.devices_per_node, None)
        self.stage_layers, self.num_stages, self.tp_cross = stage_layers, plan.num_stages, tp_cross
        self.costs: dict[tuple, float] = {}  # distinct node -> estimated seconds

    def estimate(
        self, kind: str, phase: str, count: int, flops: float, message_bytes: float, group: int, crosses_node: bool
    ) -> float:
        """A node's estimated seconds. The same node recurs across stages and passes: each distinct one is costed
        once."""
        key = (kind, phase, count, flops, message_bytes, group, crosses_node)
        cost = self.costs.get(key)
        if cost is None:
            cost = self.costs[key] = self.cost(*key)
        return cost

    def cost(
        self, kind: str, phase: str, count: int, flops: float, message_bytes: float, group: int, crosses_node: bool
    ) -> float:
        if kind in COLLECTIVE:
            op = COLLECTIVE[kind] or ("reduce_scatter" if self.plan.sequence_parallel else "all_reduce")
            per_node = max(1, self.domain // self._stride(kind))
            share = 1.0
            if kind == "ep_a2a" and self.plan.moe_dispatcher == "hybrid" and crosses_node:
                share = dispatch_remote_share(group, min(per_node, group), self.w.top_k)
            per_call = self.hw.comm_time(op, message_bytes, group, crosses_node, per_node, self.inter_bw, share)
            if kind == "tp_comm" and self.plan.sequence_parallel:
                gather = message_bytes / group
                per_call += self.hw.comm_time("all_gather", gather, group, crosses_node, per_node, self.inter_bw)
                per_call = self._tp_exposed(per_call, phase)
            return count * per_call
        if self.hw.blocks is not None:
            return count * self._block_seconds(kind, phase)
        if self.hw.kernels is not None and kind in KERNELS:
            return self._kernel_seconds(kind, phase, count, flops)
        return self._compute_seconds(kind, flops)

    def _stride(self, kind: str) -> int:
        """Ranks between a group's members in the rank order: tp for the groups outside it, expert-tensor
        parallelism's etp for the experts' all-to-all (Megatron's expert grid: etp innermost, then ep)."""
        if kind == "ep_a2a":
            return self.plan.expert_tp
        return self.plan.tp if kind in STRIDED_BY_TP else 1

    def _low_precision_rate(self) -> float:
        """FLOP/s of the blocks' GEMMs under workload.float8: FP8's, or the block-scaled format's own, which only
        presets whose datasheets give it have (Blackwell); elsewhere a ValueError naming the field."""
        w, hw = self.w, self.hw
        key = gemm_rate_key(w.float8)
        if key not in hw.flops_per_s:
            raise ValueError(
                f"workload.float8 {w.float8!r} needs tensor cores that run it: hardware {hw.id!r} has no {key} "
                "matmul rate (block-scaled FP8 and FP4 run on Blackwell: b200-180gb, b300-288gb, gb200-nvl72, "
                "gb300-nvl72)"
            )
        return 1 / hw.compute_time(1.0, key)

    def _kernel_seconds(self, kind: str, phase: str, count: int, flops: float) -> float:
        """On a GPU preset: a forward's or backward's seconds per FLOP (gnn.costs.gpu) times the node's FLOPs (a
        backward's are twice the forward's); a recompute node reruns whole layers' forwards; the embedding moves
        bytes only."""
        c = self.c
        if kind == "embed":
            return count * self._seconds("embed", "forward")
        if phase == "recompute":
            layer = c.attn_flops + c.mlp_flops
            rerun = self._seconds("attn", "forward") + self._seconds("mlp", "forward")
            return flops * rerun / layer if layer else 0.0
        fwd_flops = {"attn": c.attn_flops, "mlp": c.mlp_flops, "head": c.head_flops}[kind]
        if not fwd_flops:
            return 0.0
        if phase == "backward":
            return flops * (self._seconds(kind, "backward") + self._accumulation_seconds(kind)) / (2 * fwd_flops)
        return flops * self._seconds(kind, "forward") / fwd_flops

    def _accumulation_seconds(self, kind: str) -> float:
        """plan.grad_accumulation_pass: one micro-batch's gradients of a block added into fp32 buffers, a pass over
        its weights on this rank (the gradient and the buffer read, the buffer written), at the rate the kernel
        table's residual add streams bytes (3 elements of the dtype an element), else the datasheet bandwidth."""
        plan, c = self.plan, self.c
        if not (plan.grad_accumulation_pass and plan.fp32_grads):
            return 0.0
        params = {"attn": c.layer_params * c.attn_share, "mlp": c.layer_params * (1 - c.attn_share)}
        params["head"] = c.head_params
        db = dtype_bytes(self.w)
        nbytes = params[kind] * (db + 2 * FP32_BYTES)
        return self.hw.kernels.for_phase("forward").elementwise_seconds("add", nbytes / (3 * db), nbytes, 1)

    def _seconds(self, kind: str, phase: str) -> float:
        """One forward or backward of ``kind`` for one micro-batch on one tp rank (gnn.costs.gpu)."""
        key = ("seconds", kind, phase)
        found = self.costs.get(key)
        if found is None:
            kernels = self.hw.kernels.for_phase(phase)
            found = forward_seconds(kernels, self.w, self.plan, kind, self._rates(), dtype_bytes(self.w))
            self.costs[key] = found
        return found

    def _rates(self) -> tuple[Rate, Rate]:
        """(the blocks' linears', the rest's) GEMM rates: FP8's under workload.float8."""
        w = self.w
        rest = Rate(1 / self.hw.compute_time(1.0, w.dtype), w.dtype)
        return (rest if w.float8 == "none" else Rate(self._low_precision_rate(), f"float8_{w.float8}")), rest

    def _tp_exposed(self, seconds: float, phase: str) -> float:
        """A layer boundary's all-gather and reduce-scatter under plan.tp_comm_overlap, on a GPU preset: split in tp
        chunks under the GEMMs on either side of it (one block's linears, the mean of attention's and the MLP's),
        what they cannot hide is exposed, and never less than one chunk (the first waits for its data)."""
        plan = self.plan
        if not plan.tp_comm_overlap or self.hw.kernels is None:
            return seconds
        phase = "backward" if phase == "backward" else "forward"
        kernels, db = self.hw.kernels.for_phase(phase), dtype_bytes(self.w)
        linear = self._rates()[0]
        hide = 0.5 * sum(linear_seconds(kernels, self.w, plan, kind, linear, db) for kind in ("attn", "mlp"))
        return max(seconds - hide, seconds / plan.tp)

    def _compute_seconds(self, kind: str, flops: float) -> float:
        """At the hardware's throughput. FP8 training (torchao's float8) runs the linears of the blocks in FP8,
        not the fused attention core nor the LM head (torchtitan leaves the output projection in bfloat16)."""
        if self.w.float8 == "none" or kind not in ("attn", "mlp"):
            return self.hw.compute_time(flops, self.w.dtype)
        gemm = flops * (self.c.attn_gemm_share if kind == "attn" else 1.0)
        return gemm / self._low_precision_rate() + self.hw.compute_time(flops - gemm, self.w.dtype)

    # --- compute from the block profile (gnn.costs.blocks) --------------------------------------------------

    def _features(self, block: str) -> tuple[float, float, float]:
        return block_features(self.c, block, dtype_bytes(self.w))

    def _wrappers(self, phase: str) -> list[str]:
        """The block profile's layer variants this plan wraps its layers in, for a forward or backward."""
        plan, found = self.plan, []
        if plan.tp > 1:
            found.append("tp_sp" if plan.sequence_parallel else "tp")
        if plan.fsdp_enabled:  # FSDP's hooks run at dp = 1 too
            found.append(plan.sharding)
        if plan.recompute != "none" and phase == "forward":  # in backward, checkpointing is the recompute node
            found.append(plan.recompute)
        return found

    def _block_seconds(self, kind: str, phase: str) -> float:
        """One block's seconds: its plain cost, plus half of what the plan's wrappers add to a layer for an
        attention or MLP block (they wrap the layer, its two blocks together). A recompute node costs what
        checkpointing adds to a layer's backward."""
        blocks, layer = self.hw.blocks, self._features("layer")
        if phase == "recompute":
            return max(blocks.wrapper_seconds(self.plan.recompute, "backward", layer), 0.0)
        seconds = blocks.seconds(kind, "plain", phase, self._features(kind))
        if kind in ("attn", "mlp"):
            seconds += 0.5 * sum(self._wrapper_seconds(v, phase, layer) for v in self._wrappers(phase))
        return max(seconds, 0.0)

    def _wrapper_seconds(self, variant: str, phase: str, layer: tuple[float, float, float]) -> float:
        """What a wrapper adds to a layer's phase. Tensor parallelism, where the profile timed a layer on a pool
        of tp real ranks: that layer less what the graph charges besides (the plain attention and MLP blocks
        at their shard, and the layer's two tp_comm calls): DTensor's collective path on a real group, which a
        one-rank mesh and the raw collective curves both miss. Elsewhere the one-rank wrapper cost."""
        blocks, plan = self.hw.blocks, self.plan
        group = blocks.group_seconds(variant, plan.tp, phase, layer) if variant in ("tp", "tp_sp") else None
        if group is None:
            return blocks.wrapper_seconds(variant, phase, layer)
        plain = sum(blocks.seconds(kind, "plain", phase, self._features(kind)) for kind in ("attn", "mlp"))
        calls = 2 * self.cost("tp_comm", phase, 1, 0.0, self.c.boundary_bytes, plan.tp, self.tp_cross)
        return max(group - plain - calls, 0.0)

    def optimizer_seconds(self, stages: tuple[int, ...], params: float) -> float | None:
        """AdamW's step on this rank's ``params`` (already sharded): a cost per tensor and per parameter, on
        DTensors under FSDP or TP. ZeRO-1 steps a plain optimizer over its 1/dp of the tensors."""
        if self.hw.blocks is None:
            return None if self.hw.kernels is None else self.hw.kernels.optimizer_seconds(params)
        plan, last = self.plan, self.num_stages - 1
        tensors = sum(TENSORS_PER_LAYER * self.stage_layers[s] + 2 * (s == 0) + 3 * (s == last) for s in stages)
        if plan.sharding == "zero1":
            tensors /= plan.data_ranks
        variant = "fsdp" if plan.fsdp_enabled else "tp" if plan.tp > 1 else "plain"
        return self.hw.blocks.optimizer_seconds(variant, tensors, params)
