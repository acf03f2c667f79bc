"""Running plans on ranks: the local gloo pool, torchrun on GPU clusters, the sweep runner, result rows."""
