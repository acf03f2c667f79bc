"""How a workload is parallelised (Plan) and where it runs (Cluster)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from collect.schema.choices import (
    CONVENTIONS,
    Attention,
    AttentionKernel,
    MoeDispatcher,
    OptimizerStateDType,
    PipelineSchedule,
    PipelineSplit,
    Recompute,
    Sharding,
    Strict,
)
from collect.schema.stages import split_by_weights

# bounds far past any cluster (a million GPUs), so no degree reaches a check's arithmetic unbounded; the service
# bounds a plan's pipeline tighter (serve.schemas)
MAX_DEGREE = 2**20
MAX_MICROBATCHES = 2**30
MAX_STAGES = 2**16  # pp * virtual_stages: checks.plan_problems lists each stage's layers only below this
# fields added after data was collected: rows without them read their defaults, run ids leave them out at those
LATER_FIELDS = ("cp", "ep", "etp", "float8_all_gather", *CONVENTIONS)
CLUSTER_LATER_FIELDS = ("nvlink_domain", "nics_per_node", "nic_bandwidth_bytes_per_s")  # Network's


class Plan(Strict):
    """How a workload is parallelised."""

    dp: int = Field(default=1, ge=1, le=MAX_DEGREE)
    """Data-parallel degree."""
    tp: int = Field(default=1, ge=1, le=MAX_DEGREE)
    """Tensor-parallel degree (Megatron column/row split of attention and MLP)."""
    pp: int = Field(default=1, ge=1, le=MAX_DEGREE)
    """Pipeline-parallel degree (number of ranks in a pipeline)."""
    sharding: Sharding = "none"
    """How data-parallel replicas hold state: DDP, ZeRO-1 optimizer sharding,
    FSDP2 without reshard after forward (ZeRO-2-like), or full FSDP (ZeRO-3)."""
    recompute: Recompute = "none"
    """Activation checkpointing per block: none, selective (save matmul outputs
    only), or full."""
    pp_schedule: PipelineSchedule | None = None
    """Pipeline schedule; required when pp > 1 (defaults to 1f1b), None when pp = 1."""
    virtual_stages: int = Field(default=1, ge=1, le=MAX_DEGREE)
    """Model chunks per pipeline rank; > 1 only with interleaved_1f1b."""
    num_microbatches: int = Field(default=1, ge=1, le=MAX_MICROBATCHES)
    """Micro-batches per optimizer step (pipeline depth or gradient accumulation)."""
    sequence_parallel: bool = False
    """Shard norms and residual activations along the sequence over the tp axis."""
    cp: int = Field(default=1, ge=1, le=MAX_DEGREE)
    """Context-parallel degree: each sample's sequence is split over cp ranks, attention runs as a ring
    passing key/value shards (torch's context_parallel); its own mesh axis between dp and tp."""
    ep: int = Field(default=1, ge=1, le=MAX_DEGREE)
    """Expert-parallel degree (moe): the experts of a layer are split over ep ranks, tokens reach them by
    all-to-all; ep borrows its ranks from the dp x cp ranks (as torchtitan's dp_shard_in_ep), and from the tp
    ranks where the experts are not split as finely as the attention (etp < tp, Megatron's expert grid), adding
    none."""
    etp: int | None = Field(default=None, ge=1, le=MAX_DEGREE)
    """Expert-tensor-parallel degree (moe): each expert's SwiGLU is split over etp ranks. Unset: over tp, as the
    dense MLP (Megatron's default for expert_tensor_parallel_size). The experts' ranks are (dp x cp x tp) / etp,
    which ep divides."""
    float8_all_gather: bool = False
    """With workload.float8 'tensorwise' and FSDP: parameters are cast to FP8 before FSDP gathers them."""
    # conventions: how a framework runs the same plan, where that changes its cost; the defaults are the
    # collector's (the rows of data/runs hold them), Megatron and Nanotron set the other value
    loss_parallel: bool = False
    """With tp: the output projection's logits and the cross-entropy stay sharded over the vocabulary (Megatron's
    vocab-parallel cross entropy, Nanotron, torchtitan's loss_parallel; the collector runs it without pipelining).
    False: every tp rank holds whole fp32 logits (a ColwiseParallel head with a replicated output, the collector's
    default)."""
    pipeline_keeps_outputs: bool = True
    """With pp: the last stage keeps every micro-batch's output until the step ends, then merges them into one
    tensor beside them (torch.distributed.pipelining returning the merged outputs, the collector's default). False:
    only the loss is kept (Megatron, Nanotron; torch's schedule.step(return_outputs=False))."""
    pipeline_holds_buffers: bool = True
    """With pp: each micro-batch's receive buffer, and the gradients passed back for it, are held until the step
    ends, and each output to its backward, or to the step's end under the interleaved schedule, which waits its
    sends only then (torch.distributed.pipelining: the collector's, torchtitan's). False: they live only while used
    (Megatron's and Nanotron's point-to-point sends)."""
    sequence_parallel_regather: bool = False
    """With sequence_parallel: backward gathers each column-parallel linear's input again, so only its sequence
    shard is kept (Megatron, Nanotron). False: the gathered input is saved whole for backward (torch's DTensor
    SequenceParallel, the collector's and torchtitan's)."""
    fp32_master_weights: bool = False
    """With a 2-byte dtype: the optimizer updates an fp32 copy of the weights, sharded as its state is (Megatron's
    and Nanotron's mixed precision; under FSDP the fp32 shard is the parameter, as torchtitan's mixed-precision
    policy keeps it). False: the optimizer steps the weights in their own dtype (the collector's)."""
    fp32_grads: bool = False
    """With a 2-byte dtype: gradients accumulate and are reduced in fp32 buffers, whole on every data rank unless
    FSDP shards them (Megatron's main_grad with bf16, Nanotron's accumulate_grad_in_fp32, FSDP's fp32
    reduce_dtype). False: gradients are kept and reduced in the weights' dtype (the collector's)."""
    grad_accumulation_pass: bool = False
    """With fp32_grads: after each micro-batch's backward, its gradients (written in the weights' dtype) are added
    into the fp32 buffers in a pass of their own, every weight read twice and written once (Nanotron's
    FP32GradientAccumulator: an add_ per parameter). False: accumulated where they are computed (Megatron's
    gradient_accumulation_fusion: the weight-gradient GEMM adds into main_grad), or not in another dtype."""
    float8_params: bool = False
    """With workload.float8 and fp32 master weights: the weights are held quantised only (Megatron's fp8_param_gather,
    on in Megatron-Bridge's FP8 and MXFP8 recipes: training/mixed_precision.py at 067f987d). False: a 2-byte weight
    and Transformer Engine's quantised copy of it both stay (elsewhere, and in NVFP4 and sub-channel recipes)."""
    pipeline_split: PipelineSplit = "layers"
    """With pp: how layers are assigned to stages (stage_layers). layers: evenly, the embedding and the loss counting
    as a layer each where they do not divide (Megatron, torchtitan, the collector). weights: stages balanced by
    weights, the head counting vocab x hidden, each stage taking blocks until its share is passed (Nanotron), which
    puts more layers on the first stages."""
    attention: Attention = "flash"
    """How the attention core runs. flash: fused (FlashAttention, cuDNN's, torch's SDPA kernels; every framework
    above and the collector), keeping no s x s scores. eager: the scores as a batched matmul and a softmax whose
    output each layer keeps for backward, s x s per head and sample (Megatron before its fused attention, Hugging
    Face's eager attention), its matmuls running over every score, the causal half too."""
    attention_keeps_packed_qkv: bool = False
    """With multi-head attention (workload kv_heads = heads): the attention core saves q as a view of the copy that
    q, k and v are rearranged into after their projection, so that copy stays whole beside k and v's own copy: k
    and v are kept twice (Nanotron's CausalSelfAttention, which rotates q in place in that copy and copies k and v
    out for the rotary). False: q, k and v are kept once each (the collector's, torchtitan's)."""
    attention_kernel: AttentionKernel = "sdpa"
    """Which fused kernel runs a flash attention core (time only; the same memory): sdpa, the one torch's
    scaled_dot_product_attention picks (the collector's, torchtitan's); flash2, FlashAttention-2 (Nanotron's);
    cudnn, cuDNN's fused attention (Transformer Engine's on Hopper: Megatron's, NeMo's)."""
    tp_layer_latency: bool = False
    """With tp: every layer of every micro-batch waits a latency that grows with tp - 1, far longer under pipeline
    parallelism, whatever the model's size or the micro-batch's. Measured, with no mechanism known, in the
    Ultra-Scale Playbook's Nanotron runs: on the 1.3B and the 3.6B model alike, time per layer and micro-batch
    plateaus near 4 ms x (tp - 1) with pp > 1 at tp 8 and 16 (more at tp 32) and 0.5 to 0.65 ms x (tp - 1)
    without. Megatron's published runs do not pay it: some of vTrain's and NeMo's take 2.5 and 1.6 times less time
    in all than that latency alone would.
    Priced only by the fitted models, whose coefficients for it come from training rows (gnn.costs.efficiency);
    the simulator leaves it out. False: no such latency (the collector's, Megatron's, torchtitan's)."""
    grad_reduce_overlap: bool = False
    """The data-parallel gradient reduction runs in buckets while the last micro-batch's backward still computes
    (Megatron's overlap_grad_reduce, which NeMo's recipes turn on): only what the backward cannot hide, and at
    least the last bucket, waits after it. False: the whole reduction waits for the backward, as the simulator
    prices the collector's gloo ranks, whose two cores run the all-reduce and the backward in turn."""
    param_gather_overlap: bool = False
    """The distributed optimizer's parameter all-gather (plan.sharding zero1) runs in buckets under the next
    step's first forward (Megatron's overlap_param_gather): only what that forward cannot hide is exposed.
    False: the all-gather follows the optimizer step whole (torch's ZeroRedundancyOptimizer, Nanotron's ZeRO-1)."""
    tp_comm_overlap: bool = False
    """With tp and sequence_parallel: each layer's all-gather and reduce-scatter run in chunks under the GEMMs
    that consume and produce them (Transformer Engine's userbuffers; NeMo's recipes set tp_comm_overlap on Hopper
    and Blackwell): only what those GEMMs cannot hide, and at least one of tp chunks, is exposed. False: the
    collective runs between the GEMMs (Megatron-LM's default, torch's DTensor, Nanotron)."""

    moe_dispatcher: MoeDispatcher = "alltoall"
    """With ep across nodes, how tokens reach their experts. alltoall: every routed copy of a token crosses the
    network on its own (Megatron's alltoall dispatcher, torchtitan's, the collector's). hybrid: a token crosses
    once to each remote node holding any of its experts, and NVLink spreads it there (DeepEP's and HybridEP's
    internode kernels, Megatron's flex dispatcher)."""
    optimizer_state_dtype: OptimizerStateDType | None = None
    """AdamW's two moments: float32 or bfloat16 (torchtune's and Megatron's precision-aware optimizer keep them in
    bf16, halving that state). Unset: as torch's AdamW keeps them, in the dtype of the parameters it steps (fp32
    with plan.fp32_master_weights, else the workload's: pure bf16 training keeps bf16 moments)."""

    @model_validator(mode="before")
    @classmethod
    def _default_schedule(cls, data):
        # before field validation: pp may be anything here, and a bad one is the field check's to report
        pp = data.get("pp", 1) if isinstance(data, dict) else None
        pp = int(pp) if isinstance(pp, str) and pp.strip().isdigit() and len(pp) < 10 else pp
        if isinstance(pp, int) and pp > 1 and data.get("pp_schedule") is None:
            data = {**data, "pp_schedule": "1f1b"}
        return data

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def data_ranks(self) -> int:
        """Ranks over the same parameters that split the batch (dp) and each sample's sequence (cp): they sync
        gradients, and FSDP and ZeRO shard over them (torchtitan's dp_shard_cp mesh)."""
        return self.dp * self.cp

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def expert_tp(self) -> int:
        """How many ranks split one expert (etp, or tp where unset)."""
        return self.etp or self.tp

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are wrapped by FSDP2 (fsdp_grad_op or fsdp_full); its hooks run even at dp = 1."""
        return self.sharding in ("fsdp_grad_op", "fsdp_full")

    @property
    def reshard_after_forward(self) -> bool:
        """FSDP frees each block's gathered parameters after its forward and gathers them again for the
        backward (fsdp_full, ZeRO-3); fsdp_grad_op keeps them (ZeRO-2-like)."""
        return self.sharding == "fsdp_full"

    @property
    def interleaved(self) -> bool:
        return self.pp_schedule == "interleaved_1f1b"

    def stage_layers(self, layers: int, costs: tuple[int, int] | None = None) -> tuple[int, ...]:
        """Transformer layers of each of the num_stages stages (stage s on pipeline rank s % pp). ``costs``: a
        layer's and the head's weight (Workload.pipeline_costs), which pipeline_split 'weights' needs.

        Split by layers: layers that divide evenly are split evenly (Megatron's default, and what the collector
        ran). Otherwise the embedding and the loss count as one layer each, as Megatron's
        --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split do, and what is left over
        goes to the earliest stages, as torchtitan's generate_llm_fqn_per_model_part does: Llama 3 405B's 126
        layers on 16 stages give 7 to the first and last stage and 8 to each other. The first or last stage may hold
        only the embedding or the head (28 layers on 16 stages: 1, 2, ..., 2, 0); checks.plan_problems refuses an
        empty middle stage.
        """
        stages = self.num_stages
        if self.pipeline_split == "weights":
            if costs is None:  # an even split would be returned silently: the head's weight is what moves layers
                raise ValueError("plan.pipeline_split 'weights' needs the workload's costs (Workload.pipeline_costs)")
            return split_by_weights(layers, *costs, stages)
        if layers % stages == 0:
            return (layers // stages,) * stages
        base, extra = divmod(layers + 2, stages)
        counts = [base + (s < extra) for s in range(stages)]
        counts[0] -= 1
        counts[-1] -= 1
        return tuple(counts)


class Network(BaseModel):
    """How a cluster's GPUs reach each other, where it differs from a node of NVLink and a NIC per GPU: declared
    here once, for the collector's Cluster and the service's ClusterSpec."""

    nvlink_domain: int | None = Field(default=None, ge=1, le=MAX_DEGREE)
    """GPUs that reach each other over NVLink: a node's (None), or a rack's where nodes share an NVLink switch
    fabric (72 in a GB200 NVL72 described as trays of 4). A group inside it never touches a NIC."""
    nics_per_node: int | None = Field(default=None, ge=1, le=64)
    """Network interfaces per node for the inter-node fabric (None: one per device, as in DGX and NVL72 nodes,
    rail-optimised). With fewer, the node's devices share them: a group's traffic across nodes gets
    nics_per_node / devices_per_node of a NIC per device."""
    nic_bandwidth_bytes_per_s: int | None = Field(default=None, ge=1, le=10**13)
    """One NIC's bandwidth per direction (None: the hardware preset's: 50 GB/s, 400 Gb/s NDR InfiniBand)."""


class Cluster(Strict, Network):
    """Where the plan runs."""

    nodes: int = Field(default=1, ge=1)
    """Number of machines."""
    devices_per_node: int = Field(ge=1)
    """Ranks per machine (GPUs, or CPU processes here)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Torch device type of every rank."""
    device_kind: str = "cpu"
    """What the device is (e.g. cpu, a100-80gb); names a hardware preset where one exists."""
    memory_bytes: int = Field(ge=1)
    """Per-device memory capacity; a plan whose peak exceeds it is labelled oom."""
    backend: Literal["gloo", "nccl"] = "gloo"
    """torch.distributed backend."""

    @model_validator(mode="after")
    def _backend_matches_device(self) -> "Cluster":
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError(f"backend 'nccl' needs device 'cuda', got device {self.device!r}")
        if self.nvlink_domain is not None and self.nvlink_domain % self.devices_per_node:
            raise ValueError(
                f"nvlink_domain ({self.nvlink_domain}) must be whole nodes: a multiple of devices_per_node "
                f"({self.devices_per_node})"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def nvlink_ranks(self) -> int:
        """Ranks that share an NVLink domain: what a group must span to cross the network."""
        return self.nvlink_domain or self.devices_per_node
