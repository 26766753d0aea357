"""What the user asks for: the hyperparameters (fields, parsing, validation, advice),
the per-variable maps, the per-leaf specs and the sparsity schedule."""
