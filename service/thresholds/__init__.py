"""Threshold policies, the pure evaluator and alert state machine; notify/ sends what it decides."""
