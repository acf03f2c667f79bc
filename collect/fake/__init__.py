"""Per-rank peak memory at full size without the hardware: the collector's own step traced under fake tensors."""
