"""The learned surrogate: execution graphs and their simulation, the graph dataset, the GNN and the baselines,
their training and tracking, and the batched prediction path. Imports collect, never serve or experiments."""
