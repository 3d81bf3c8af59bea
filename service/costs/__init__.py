"""The waste model: pure functions over samples, allocations and prices (no database, no clock)."""
