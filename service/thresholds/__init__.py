"""Threshold policies, the pure evaluator and alert state machine, silences and notifiers."""
