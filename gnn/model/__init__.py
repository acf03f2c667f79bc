"""The GNN: the network and its Lightning module for training, the ensemble with calibrated intervals, the
fused plain-torch forward pass for inference, and the weights-plus-JSON checkpoint."""
