"""What users read from a pruned run: masks, thresholds and summaries, shortfall
warnings, the state's shardings, export and sizes, and the FLOPs convention."""
