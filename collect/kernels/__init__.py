"""Kernel tables: the operators of the plans people run, timed on one device at the shapes their parallelism gives
each rank (GEMMs, flash attention, element-wise work, the optimizer step), written as a table a hardware preset
can name (data/hardware/kernels/); collect.kernels.table reads it back and gnn.costs.gpu prices blocks from it.

    python -m collect.kernels --out data/hardware/kernels/NAME.json [--grid full|quick] [--budget-s 420]

Needs torch alone (no pydantic), so it runs on a bare GPU machine as it is.
"""
