"""Measured rows to graphs: featurisation, the cached graph dataset (python -m gnn.dataset), named splits,
and the source hashing its cache key rests on."""
