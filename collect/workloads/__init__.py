"""Model-specific code: one module per workload family."""
