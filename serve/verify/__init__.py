"""Verify before spending: a plan traced under fake tensors (collect.fake), its exact per-stage peak beside the
prediction (python -m serve verify, POST /verify, the explorer's Verify button)."""
