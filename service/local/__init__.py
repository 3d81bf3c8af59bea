"""``gpuwarden up`` and ``gpuwarden demo``: the central service and local agents in one process."""
