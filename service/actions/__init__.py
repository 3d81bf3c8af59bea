"""Acting on waste: the reclaim drivers (Slurm, Kubernetes, action webhook) behind one Protocol."""
