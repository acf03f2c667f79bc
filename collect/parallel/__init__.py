"""Model-agnostic parallelisms: one apply_* per technique, composed by parallelize()."""
