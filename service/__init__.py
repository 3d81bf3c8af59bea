"""GPU Warden: GPU telemetry, idle-GPU alerting and wasted-spend reports."""

__version__ = "0.1.0"
