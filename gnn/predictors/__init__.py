"""Every predictor behind one fit / predict interface (base), registered by name (registry): the analytical,
simulator and gradient-boosting baselines and the GNN surrogate; and the accuracy metrics they are scored by."""
