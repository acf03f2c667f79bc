"""Costs of compute and communication on one machine, from a fingerprint or a preset.

Measured fingerprints give a matmul throughput per dtype and Lin et al.'s
three-region curve per (collective, group size). Presets give datasheet peak
FLOP/s and link bandwidths; their collectives are priced as NCCL's tuning
model prices them (gnn.costs.collectives), their compute kernel by kernel
(gnn.costs.gpu). A message is what one rank passes in: all-gather's shard,
reduce-scatter's and all-reduce's whole buffer.
A fingerprint with a block profile (collect.measure.blocks) also prices compute block by
block (gnn.costs.blocks): a fixed cost per block and wrapper beside its FLOPs.
"""

from __future__ import annotations

from functools import lru_cache

from collect.hardware.costmodel import ThreeRegionCurve
from collect.hardware.records import load_hardware
from gnn.costs.blocks import BlockModel
from gnn.costs.collectives import all_to_all_seconds, ring_seconds, send_recv_seconds, tree_all_reduce_seconds
from gnn.costs.gpu import GpuKernels


class HardwareModel:
    def __init__(self, record: dict):
        self.record = record
        self.id = record["id"]
        self.measured = record.get("source") == "measured"
        self.flops_per_s = self._flops(record)
        self.memory_bandwidth = (
            next((p["bytes_per_s"] for p in record["compute"] if p["kind"] == "memory_bandwidth"), None) or 1e10
        )
        self.curves = {
            (op, int(g)): ThreeRegionCurve(**c)
            for op, by_group in record.get("collective_fits", {}).items()
            for g, c in by_group.items()
        }
        links = record.get("links", {})
        self.intra_bw = links.get("intra_node", {}).get("bandwidth_bytes_per_s")
        self.inter_bw = links.get("inter_node", {}).get("bandwidth_bytes_per_s")
        # what nccl-tests measured on the same hardware, where a preset holds it: the share of each link's datasheet
        # bandwidth NCCL's collectives reach, and the message at which they reach half of it
        nccl = links.get("measured_nccl", {})
        self.link_share = (nccl.get("intra_node_share", 1.0), nccl.get("inter_node_share", 1.0))
        self.half_bytes = nccl.get("half_bandwidth_bytes", 0.0)
        self.devices_per_node = record.get("devices_per_node", 1 << 30)
        self.blocks = BlockModel(record["blocks"]) if record.get("blocks") else None
        self.kernels = GpuKernels.of(record, self.memory_bandwidth)  # GPU presets: compute kernel by kernel
        if self.blocks is not None and record.get("blocks_compute"):  # borrowed from another fingerprint
            source = HardwareModel({"id": "source", "compute": record["blocks_compute"], "source": "measured"})
            self.blocks.rescale_flops(source.flops_per_s["float32"] / self.flops_per_s["float32"])

    @staticmethod
    def _flops(record: dict) -> dict[str, float]:
        if "peak_flops_per_s" in record:
            return dict(record["peak_flops_per_s"])
        best: dict[str, float] = {}
        for p in record["compute"]:
            if p["kind"] == "matmul":
                best[p["dtype"]] = max(best.get(p["dtype"], 0.0), p["flops_per_s"])
        return best

    def compute_slots(self, plan) -> float:
        """Cores per pipeline rank's dp x cp x tp ranks, which the simulator shares among the compute nodes running
        at once (gnn.sim.simulate); inf when every rank has a device of its own (GPUs, and machines whose measured
        concurrency shows no slowdown)."""
        cores = self.blocks.cores if self.blocks is not None else float("inf")
        return cores / (plan.data_ranks * plan.tp)

    def compute_time(self, flops: float, dtype: str | None) -> float:
        rate = self.flops_per_s.get(dtype or "float32") or self.flops_per_s.get("bfloat16") or 1e10
        if not self.measured and dtype in (None, "float32"):
            rate = self.flops_per_s.get("bfloat16", rate)  # GPU fp32 matmuls run on TF32/bf16 tensor cores
        return flops / rate

    def comm_time(
        self,
        op: str,
        message_bytes: float,
        group: int,
        crosses_node: bool = False,
        per_node: int | None = None,
        inter_bw: float | None = None,
        remote_share: float = 1.0,
    ) -> float:
        """``per_node``: how many of the group's ranks share a node (all of them unless it crosses nodes; one
        when it does and nothing else is said); ``inter_bw``: the cluster's network bytes/s per device, where it
        states its own (gnn.costs.pricing.network); ``remote_share``: an all-to-all's share of its remote copies
        that crosses the network (gnn.costs.collectives.dispatch_remote_share)."""
        if group <= 1 or message_bytes <= 0:
            return 0.0
        if self.curves:
            return self._curve_time(op, message_bytes, group)
        intra = (self.intra_bw or 1e10) * self.link_share[0]
        inter = (inter_bw or self.inter_bw or self.intra_bw or 1e10) * self.link_share[1]
        if op == "send_recv":
            return send_recv_seconds(message_bytes, crosses_node, intra, inter)
        per_node = min(per_node or 1, group) if crosses_node else group
        if op == "all_to_all":
            return all_to_all_seconds(message_bytes, group, per_node, intra, inter, remote_share)
        buffer = message_bytes * group if op == "all_gather" else message_bytes
        ring = ring_seconds(op, buffer, group, per_node, intra, inter, self.half_bytes)
        if op == "all_reduce" and group > per_node:  # NCCL's tree, where the faster (gnn.costs.collectives)
            return min(ring, tree_all_reduce_seconds(buffer, group, per_node, intra, inter, self.half_bytes))
        return ring

    def _curve_time(self, op: str, message_bytes: float, group: int) -> float:
        groups = sorted(g for o, g in self.curves if o == op)
        nearest = min(groups, key=lambda g: (abs(g - group), -g))
        t = float(self.curves[(op, nearest)].predict(message_bytes))
        if nearest != group and op != "send_recv":  # ring steps grow with (p-1)
            t *= (group - 1) / max(nearest - 1, 1)
        return t


@lru_cache(maxsize=64)
def hardware_model(name: str, hardware_dir: str = "data/hardware") -> HardwareModel:
    return HardwareModel(load_hardware(name, hardware_dir))
