"""What a node of the execution graph costs: analytic FLOPs and bytes, the hardware model read from a
fingerprint or preset, the block model fitted to measured blocks, and the pricing that puts them together."""
