"""Prometheus exposition of the fleet: metric families from the latest sample per GPU."""
