"""One plan on one rank: the training loop, the memory window and CPU allocator, and the block profile."""
