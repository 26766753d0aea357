"""The optax transform: its state, the step order, where a mask update reads the weights,
how masks are applied to updates, and masks packed to bits."""
