"""Prometheus exposition of the fleet, pure: metric families from the latest sample per GPU."""
