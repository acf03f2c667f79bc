"""The order in which each pipeline rank runs forward (F) and backward (B) passes.

Returns, per pipeline rank, a list of (phase, stage, microbatch), where stage is
the global stage index (rank r holds stages r, r + pp, ... under interleaving).
Orders follow the schedules torch.distributed.pipelining implements:
GPipe (all forwards, then all backwards), 1F1B (warm-up of pp - rank - 1
forwards, steady one-forward-one-backward, cool-down) and Megatron's interleaved
1F1B (micro-batches in rounds of pp, chunks looped within a round, warm-up of
(pp - rank - 1) * 2 + (v - 1) * pp forwards).
"""

from __future__ import annotations

from collect.schema import Plan

Op = tuple[str, int, int]  # (phase "F" | "B", global stage, microbatch)


def rank_orders(plan: Plan) -> list[list[Op]]:
    if plan.pp == 1:
        return [_accumulation(plan.num_microbatches)]
    if plan.pp_schedule == "gpipe":
        return [_gpipe(r, plan.num_microbatches) for r in range(plan.pp)]
    if plan.pp_schedule == "1f1b":
        return [_one_f_one_b(r, plan.pp, plan.num_microbatches) for r in range(plan.pp)]
    return [_interleaved(r, plan.pp, plan.virtual_stages, plan.num_microbatches) for r in range(plan.pp)]


def _accumulation(n: int) -> list[Op]:
    return [op for m in range(n) for op in (("F", 0, m), ("B", 0, m))]


def _gpipe(rank: int, n: int) -> list[Op]:
    return [("F", rank, m) for m in range(n)] + [("B", rank, m) for m in range(n)]


def _one_f_one_b(rank: int, pp: int, n: int) -> list[Op]:
    warmup = min(pp - rank - 1, n)
    order: list[Op] = [("F", rank, m) for m in range(warmup)]
    f, b = warmup, 0
    while f < n:
        order += [("F", rank, f), ("B", rank, b)]
        f, b = f + 1, b + 1
    order += [("B", rank, m) for m in range(b, n)]
    return order


def _interleaved(rank: int, pp: int, v: int, n: int) -> list[Op]:
    total = n * v
    forwards = [_chunk_op("F", k, rank, pp, v) for k in range(total)]
    backwards = [_chunk_op("B", k, rank, pp, v) for k in range(total)]
    warmup = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    order = forwards[:warmup]
    f, b = warmup, 0
    while f < total:
        order += [forwards[f], backwards[b]]
        f, b = f + 1, b + 1
    return order + backwards[b:]


def _chunk_op(phase: str, k: int, rank: int, pp: int, v: int) -> Op:
    """The k-th forward (or backward) of a rank: micro-batches in rounds of pp, chunks looped per round."""
    round_, within = divmod(k, pp * v)
    chunk, offset = divmod(within, pp)
    if phase == "B":
        chunk = v - 1 - chunk  # backward visits chunks last-first
    return (phase, rank + chunk * pp, round_ * pp + offset)
