"""The critical-path simulator over an execution graph (time and replayed peak memory), and the truncation
that simulates long pipelines from two short ones."""
