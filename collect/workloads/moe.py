"""A mixture-of-experts MLP without token dropping, with expert parallelism through all-to-all.

A linear router scores the experts, each token goes to its top_k (weights from the softmax, as Mixtral's router
without renormalising), and the shared experts take every token. Under ``force_balanced_routing`` the token slots go
to the experts in turn instead, weighted by the router's scores for them: every expert gets the same number, as
Megatron's forced load balancing gives benchmarks, so a run's memory does not depend on what its router learned.
Tokens are sorted by expert so each expert runs one matmul chain over its tokens (torchtitan's GroupedExperts,
looped rather than grouped: CPU has no grouped GEMM).

Under expert parallelism (``shard_experts``) a rank holds experts / ep of them: the sorted tokens go to the ranks
that own their experts by one all-to-all (dispatch), come back by another (combine), as torchtitan's
ExpertParallel does. The token counts are exchanged first so every rank knows what it receives.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd, wait_tensor
from torch.distributed.device_mesh import DeviceMesh

from collect.schema import Workload


class GroupedExperts(nn.Module):
    """``experts`` SwiGLU MLPs stored as three stacked weights; tokens come sorted by expert."""

    def __init__(self, experts: int, hidden: int, ffn_hidden: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, hidden, ffn_hidden, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(experts, ffn_hidden, hidden, dtype=dtype))
        self.w3 = nn.Parameter(torch.empty(experts, hidden, ffn_hidden, dtype=dtype))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # unbind, not w1[e]: each expert's weight gradient lands in its own slot and one stack makes the whole, as
        # a grouped GEMM's one gradient; indexing sums E full-size select_backward buffers, in place or not as the
        # tensors' reference counts allow, which a fake trace's dispatch mode changes (one expert's weights apart)
        w1, w2, w3 = self.w1.unbind(0), self.w2.unbind(0), self.w3.unbind(0)
        chunks = torch.split(x, counts)
        return torch.cat([(F.silu(c @ w1[e]) * (c @ w3[e])) @ w2[e] for e, c in enumerate(chunks)])

    @torch.no_grad()
    def init_weights(self) -> None:
        for weight in (self.w1, self.w2, self.w3):
            nn.init.normal_(weight, std=0.02)


class SharedExperts(nn.Module):
    """The shared experts as one SwiGLU of their summed width (DeepSeek-V3's implementation), with 2-D weights as
    torchtitan's: FSDP shards them by rows, where a stacked (1, d, ffn) weight it pads to the whole on every rank
    (4,096 ranks of DeepSeek-V3 would each gather 4,096 copies of it, 336 GiB)."""

    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(hidden, ffn_hidden))
        self.w2 = nn.Parameter(torch.empty(ffn_hidden, hidden))
        self.w3 = nn.Parameter(torch.empty(hidden, ffn_hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ self.w1) * (x @ self.w3)) @ self.w2

    init_weights = GroupedExperts.init_weights


class MoE(nn.Module):
    def __init__(self, w: Workload):
        super().__init__()
        self.top_k, self.num_experts, self.force_balanced = w.top_k, w.experts, w.force_balanced_routing
        self.hidden, self.expert_ffn = w.hidden, w.expert_ffn_hidden
        self.router = nn.Linear(w.hidden, w.experts, bias=False)
        self.experts = GroupedExperts(w.experts, w.hidden, w.expert_ffn_hidden)
        # the shared experts run as one SwiGLU of their summed width (DeepSeek-V3's implementation)
        self.shared = SharedExperts(w.hidden, w.shared_experts * w.expert_ffn_hidden) if w.shared_experts else None
        self.ep_group: dist.ProcessGroup | None = None

    def shard_experts(self, ep_mesh: DeviceMesh) -> None:
        """Keep this rank's experts / ep experts (on the meta device, before materialisation)."""
        local = self.num_experts // ep_mesh.size()
        dtype = self.experts.w1.dtype  # the model's: made here without it they would be in torch's default, fp32
        with torch.device("meta"):
            self.experts = GroupedExperts(local, self.hidden, self.expert_ffn, dtype)
        self.ep_group = ep_mesh.get_group()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = self.router(x).softmax(dim=-1)
        if self.force_balanced:
            chosen = balanced_choice(x.shape[0], self.top_k, self.num_experts, x.device)
            weights = scores.gather(-1, chosen)
        else:
            weights, chosen = scores.topk(self.top_k, dim=-1)
        order = chosen.flatten().argsort(stable=True)  # token slots sorted by expert
        counts = expert_counts(chosen, self.num_experts)
        out = self._run_experts(x[order // self.top_k], counts)[order.argsort()]
        y = (out.view(-1, self.top_k, shape[-1]) * weights.unsqueeze(-1).to(out.dtype)).sum(dim=1)
        if self.shared is not None:
            y = y + self.shared(x)
        return y.view(shape)

    def _run_experts(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if self.ep_group is None:
            return self.experts(routed, counts.tolist())
        send_splits, recv_splits, local_counts, order = dispatch_plan(counts, self.ep_group)
        tokens = all_to_all_single_autograd(routed, recv_splits, send_splits, self.ep_group)
        out = self.experts(tokens[order], local_counts)[order.argsort()]
        return all_to_all_single_autograd(out, send_splits, recv_splits, self.ep_group)

    @torch.no_grad()
    def init_weights(self) -> None:
        self.experts.init_weights()
        if self.shared is not None:
            self.shared.init_weights()


def balanced_choice(tokens: int, top_k: int, experts: int, device: torch.device) -> torch.Tensor:
    """[tokens, top_k] experts dealt in turn: slot s of the flattened choice takes expert s % experts, so a token's
    top_k are distinct and every expert gets the same number of slots, the first (slots % experts) one more."""
    return (torch.arange(tokens * top_k, device=device) % experts).view(tokens, top_k)


# The two steps of routing whose sizes depend on the router's data: a trace under fake tensors, which has none,
# replaces them (collect.fake.trace: every expert gets the same number of tokens).
def expert_counts(chosen: torch.Tensor, experts: int) -> torch.Tensor:
    """How many of the token slots each expert was chosen for."""
    return torch.bincount(chosen.flatten(), minlength=experts)


def dispatch_plan(
    counts: torch.Tensor, group: dist.ProcessGroup
) -> tuple[list[int], list[int], list[int], torch.Tensor]:
    """An expert-parallel dispatch's sizes, from this rank's ``counts`` per expert: the tokens it sends to each rank
    and receives from each, each local expert's tokens, and the order that regroups the received tokens (by source
    rank, then expert) by expert. The counts go by the functional collective, not dist.all_to_all_single: selective
    checkpointing must see the same ops when it recomputes the layer."""
    ep = dist.get_world_size(group)
    send = counts.view(ep, -1)  # tokens for (destination rank, its local expert)
    recv = wait_tensor(all_to_all_single(send.flatten(), None, None, group)).view(ep, -1)  # [source, local expert]
    segment = torch.repeat_interleave(torch.arange(recv.numel()), recv.flatten())
    order = (segment % recv.shape[1]).argsort(stable=True)
    return send.sum(dim=1).tolist(), recv.sum(dim=1).tolist(), recv.sum(dim=0).tolist(), order
