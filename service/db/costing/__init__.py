"""The money's repositories: GPUs and allocations to price, the sums of rollups and raw samples,
and the cost day sums."""
