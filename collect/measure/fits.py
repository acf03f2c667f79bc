"""Will a plan fit before it runs? A closed-form lower bound of the largest rank's peak memory, so that
`python -m collect measure` refuses what cannot fit (a spec whose logits alone outgrow the machine) instead of
letting the kernel's OOM killer decide.

A lower bound, not a prediction: the simulator's peak (gnn.sim, priced by gnn.costs.analytic) lives in gnn,
which collect does not import, since the layers run collect -> gnn. ``python -m serve predict`` gives that
estimate. This bound counts only what a rank must hold at one moment, however the framework runs the rest:

- at the optimizer step, the weights, their gradients and AdamW's two moments, all in the weights' dtype (the
  collector's torch AdamW; fp32 master weights or gradients only add). Every parameter lives on at least one
  rank of each tp x pp (x ep) group; FSDP splits all three over the data ranks too, ZeRO-1 the moments. So the
  largest rank holds at least the group's average. A mixture of experts counts gradients and moments only for
  the top_k experts each token reaches (an expert no token reached has neither).
- in the last stage's forward, its fp32 logits, which the loss upcasts (micro_batch_size x seq_len / cp x vocab
  x 4 bytes, / tp when loss_parallel keeps them sharded), beside its weights: all of that rank's weights when
  pp = 1, the output projection alone otherwise.

Activations, communication buffers and the allocator's overheads come on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from collect.inputs import InputError
from collect.schema import DTYPE_BYTES, RunSpec

GiB = 2**30
LOGIT_BYTES = 4  # cross-entropy runs on fp32 logits (collect.workloads.gpt.cross_entropy_loss)


class WontFit(InputError):
    """A plan refused before it runs: its lower bound is over a capacity (the message has the arithmetic)."""


@dataclass(frozen=True)
class PeakBound:
    """A lower bound of the largest rank's peak, in bytes, and the arithmetic behind it."""

    state_bytes: float  # weights, gradients and moments at the optimizer step
    logits_bytes: float  # the last stage's fp32 logits
    beside_logits_bytes: float  # the weights the last stage holds while they are live
    state_terms: str
    logits_terms: str

    @property
    def bytes(self) -> float:
        return max(self.state_bytes, self.logits_bytes + self.beside_logits_bytes)

    def lines(self) -> list[str]:
        return [
            f"  weights, gradients and AdamW's two moments at the optimizer step: {self.state_terms}"
            f" = {size(self.state_bytes)}",
            f"  the last stage's fp32 logits: {self.logits_terms} = {size(self.logits_bytes)}, beside "
            f"{size(self.beside_logits_bytes)} of its weights",
        ]


def peak_lower_bound(spec: RunSpec) -> PeakBound:
    w, p = spec.workload, spec.plan
    db = DTYPE_BYTES[w.dtype]
    group = p.tp * p.pp
    whole = group * p.data_ranks  # FSDP and ZeRO shard over the data ranks, of which ep is a divisor
    split = {
        "weights": whole if p.fsdp_enabled else group * p.ep,
        "gradients": whole if p.fsdp_enabled else group * p.ep,
        "moments": whole if p.sharding != "none" else group * p.ep,
    }
    trained = w.active_params  # = num_params but for the experts no token reached
    counts = {"weights": w.num_params, "gradients": trained, "moments": 2 * trained}
    state = sum(counts[k] * db / split[k] for k in counts)
    state_terms = " + ".join(f"{counts[k]:,} {k} x {db} B / {split[k]}" for k in counts)
    logit_split = p.tp if p.loss_parallel else 1
    tokens = w.micro_batch_size * w.seq_len / p.cp
    logits = tokens * w.vocab * LOGIT_BYTES / logit_split
    logits_terms = f"micro_batch_size {w.micro_batch_size} x seq_len {w.seq_len}"
    logits_terms += f" / cp {p.cp}" if p.cp > 1 else ""
    logits_terms += f" x vocab {w.vocab} x {LOGIT_BYTES} B" + (f" / tp {p.tp}" if logit_split > 1 else "")
    head = w.vocab * w.hidden * db / (p.tp * (p.data_ranks if p.fsdp_enabled else 1))
    beside = counts["weights"] * db / split["weights"] if p.pp == 1 else head
    return PeakBound(state, logits, beside, state_terms, logits_terms)


def size(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= GiB / 8 else f"{nbytes / 2**20:.2f} MiB"


def mem_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo: what this machine can give new work without swapping (None: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fit_problems(spec: RunSpec, available_bytes: int | None, ranks_here: int, cluster: bool = True) -> list[str]:
    """Why the plan cannot fit, with the arithmetic; [] where the lower bound fits. ``available_bytes`` is this
    machine's free memory, shared by the ``ranks_here`` ranks that run on it; ``cluster``: compare with
    cluster.memory_bytes too (a sweep's small capacities are labels it measures oom against, so it does not)."""
    bound = peak_lower_bound(spec)
    over = []
    capacity = spec.cluster.memory_bytes
    if cluster and bound.bytes > capacity:
        over.append(f"  > cluster.memory_bytes {capacity:,} B ({size(capacity)})")
    if available_bytes is not None and bound.bytes > available_bytes / ranks_here:
        share = available_bytes / ranks_here
        over.append(
            f"  > this machine's MemAvailable {size(available_bytes)} / {ranks_here} rank{'s' * (ranks_here > 1)} "
            f"here = {size(share)} each"
        )
    if not over:
        return []
    return [
        f"the largest rank's peak memory is at least {size(bound.bytes)} ({bound.bytes:,.0f} B), "
        "a lower bound (activations, buffers and overheads come on top):",
        *bound.lines(),
        *over,
    ]


def refuse_unfit(specs: list[RunSpec], what: str, cluster: bool = True) -> None:
    """Raise WontFit for the first of ``specs`` that cannot fit here (all ranks of a plan run on this machine),
    saying how many more cannot; ``what`` names the input in the message."""
    available = mem_available_bytes()
    unfit = [(s, lines) for s in specs if (lines := fit_problems(s, available, s.cluster.world_size, cluster))]
    if not unfit:
        return
    spec, lines = unfit[0]
    more = f" (and {len(unfit) - 1} more of its plans)" if len(unfit) > 1 else ""
    raise WontFit(
        "\n".join(
            [
                f"error: {what}: plan {spec.run_id} cannot fit{more}, so nothing is run:",
                *lines,
                "  --allow-oom runs it anyway",
            ]
        )  # fmt: skip
    )
