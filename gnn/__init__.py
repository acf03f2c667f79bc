"""The learned surrogate: execution graphs, the graph dataset, baselines and the GNN.

Imports collect (schema, workloads, hardware); never runs training jobs.
Filled in by the execution-graph and GNN issues.
"""
