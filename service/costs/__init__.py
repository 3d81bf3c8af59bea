"""The waste model (design section 4): pure functions over samples, allocations and prices."""
