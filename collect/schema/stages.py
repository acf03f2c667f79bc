"""How Nanotron assigns layers to pipeline stages by their weights (collect.schema.Plan.stage_layers)."""

from __future__ import annotations


def split_by_weights(layers: int, layer_cost: int, head_cost: int, stages: int) -> tuple[int, ...]:
    """Nanotron's build_model (models/base.py): its blocks in order (the embedding, costing nothing, each layer,
    then the norm and the head) are placed on the current stage, which is left once the running cost passes its
    share, total x (s + 1) / stages. Integer costs and that float share, as Nanotron compares them: on ties (the
    1B model over 4 stages) a layer more or less on the first stage. The head, and any stage past the layers,
    holds none; a middle stage may then have no layer (the 1B model over 8 stages: 3, 3, 2, 3, 2, 3, 0, 0).
    Computed stage by stage, not layer by layer (a request may name 10^8 layers): stage s takes layers until the
    running cost first passes its share, the same comparison as Nanotron's loop, solved for the layer count."""
    total = layers * layer_cost + head_cost
    counts, placed = [0] * stages, 0
    for stage in range(stages):
        if placed == layers:
            break
        share = total * ((stage + 1) / stages)
        # the fewest layers k >= 1 with (placed + k) * layer_cost > share: a guess from the float quotient, then
        # corrected by the exact integer-against-float comparison the loop makes
        k = max(1, int(share // layer_cost) + 1 - placed)
        while k > 1 and (placed + k - 1) * layer_cost > share:
            k -= 1
        while placed + k < layers and (placed + k) * layer_cost <= share:
            k += 1
        k = min(k, layers - placed)
        counts[stage] = k
        placed += k
    return tuple(counts)
