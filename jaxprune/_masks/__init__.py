"""From weights to masks: the mask update, the magnitude rule, blocks, N:M, the one tie
rule, and the scoring methods of the functional API."""
