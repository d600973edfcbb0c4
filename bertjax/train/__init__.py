"""Training layer: optimizer, sharding, state, step, loop and checkpoints."""
