"""Header values that carry data (a subject with a job id, recipients, a delivery id): checked
before they are sent, so a value with CR or LF can neither add a header nor break a message.

A value that fails is a ValidationFailed naming the header: the outbox fails the delivery with
that reason at once (the dead letter of a notification), since no retry can make it sendable.
"""

from __future__ import annotations

from service.core.job_ids import control_problem
from service.errors import ValidationFailed


def header_value(name: str, value: str) -> str:
    """``value`` unchanged if it can be the value of header ``name``, else ValidationFailed."""
    problem = control_problem(value)
    if problem is not None:
        raise ValidationFailed(f"header {name}", f"{problem}; the message cannot be sent as it is")
    return value
