"""A plan as Optuna trial parameters and back: sampled conditionally (schedules only with pp > 1, sequence
parallel only with tp > 1, ep only for moe models (etp only with tp > 1), FP8 only where the space has it, and in
a collectable-only space the shardings torch composes with tp), so almost every trial is a valid plan."""

from __future__ import annotations

import optuna

from collect.schema import RunSpec
from serve.search.space import OVER_BUDGET, Space, layout_name


def suggest(trial: optuna.Trial, space: Space) -> RunSpec | None:
    """Sample one plan; None if the sampled combination is not a valid plan."""
    layouts = space.layouts_by_name
    layout = layouts[trial.suggest_categorical("layout", list(layouts))]
    pp, dp, cp, tp = layout
    mbs = trial.suggest_categorical("micro_batch_size", list(space.micro_batch_sizes))
    sharding = trial.suggest_categorical(_sharding_param(space, dp, tp), space.shardings_for(dp, tp))
    recompute = trial.suggest_categorical("recompute", list(space.recomputes))
    schedule, virtual = None, 1
    if pp > 1:
        choices = [
            s if s != "interleaved_1f1b" else f"{s}_v{v}"
            for s in space.schedules
            for v in (space.virtual_stages if s == "interleaved_1f1b" else (1,))
        ]
        picked = trial.suggest_categorical("schedule", choices)
        schedule, virtual = (
            (picked.rsplit("_v", 1)[0], int(picked.rsplit("_v", 1)[1])) if "_v" in picked else (picked, 1)
        )
    sp = trial.suggest_categorical("sequence_parallel", [False, True]) if tp > 1 else False
    # ep from a fixed list (a plan whose ep does not divide dp x cp is pruned with the reason)
    ep = trial.suggest_categorical("ep", list(space.expert_degrees)) if len(space.expert_degrees) > 1 else 1
    etps = space.expert_tps(tp)
    etp = trial.suggest_categorical("etp", ["tp", 1]) if len(etps) > 1 else None
    precision = _suggest_precision(trial, space, sharding)
    choice = (layout, mbs, sharding, recompute, schedule, virtual, sp, ep, *precision, None if etp == "tp" else etp)
    spec = space.spec(*choice)
    if spec is None:  # pruned: the trial says why
        why = "over the prediction budget (gnn.inference.cost): the service would refuse it alone"
        over = space.state(choice) == OVER_BUDGET
        trial.set_user_attr("invalid", why if over else "rejected by collect.schema.plan_problems")
    return spec


def _sharding_param(space: Space, dp: int, tp: int) -> str:
    """One name per set of choices, as Optuna wants: a collectable-only space offers fewer shardings with tp."""
    return f"sharding_tp{min(tp, 2)}_dp{min(dp, 2)}" if space.collectable_only else "sharding"


def _suggest_precision(trial: optuna.Trial, space: Space, sharding: str) -> tuple[str | None, bool]:
    if not space.precisions:
        return None, False
    f8 = trial.suggest_categorical("float8", list(space.precisions))
    if f8 == "tensorwise" and sharding.startswith("fsdp"):
        return f8, trial.suggest_categorical("float8_all_gather", [False, True])
    return f8, False


def params_of(spec: RunSpec, space: Space) -> dict:
    """The trial parameters under which suggest() samples ``spec``: for enqueueing a known plan."""
    p = spec.plan
    params = {
        "layout": layout_name((p.pp, p.dp, p.cp, p.tp)),
        "micro_batch_size": spec.workload.micro_batch_size,
        _sharding_param(space, p.dp, p.tp): p.sharding,
        "recompute": p.recompute,
    }
    if p.pp > 1:
        params["schedule"] = (
            p.pp_schedule if p.pp_schedule != "interleaved_1f1b" else f"{p.pp_schedule}_v{p.virtual_stages}"
        )
    if p.tp > 1:
        params["sequence_parallel"] = p.sequence_parallel
    if len(space.expert_degrees) > 1:
        params["ep"] = p.ep
    if len(space.expert_tps(p.tp)) > 1:
        params["etp"] = "tp" if p.etp is None else p.etp
    if space.precisions:
        params["float8"] = spec.workload.float8
        if spec.workload.float8 == "tensorwise" and p.fsdp_enabled:
            params["float8_all_gather"] = p.float8_all_gather
    return params
