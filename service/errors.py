"""The one error hierarchy of GPU Warden; the API layer maps these to HTTP statuses."""

from __future__ import annotations


class WardenError(Exception):
    """Base of every error GPU Warden raises on purpose."""


class ConfigError(WardenError):
    """A setting or config file is wrong; the message names what and why."""


class DatabaseUnavailable(WardenError):
    """The database cannot be opened or must not be used; the message names the fix."""


class SchemaOutOfDate(WardenError):
    """The database schema is not at the newest migration."""


class ValidationFailed(WardenError):
    """Input is well-formed but not acceptable; ``field`` names the offending item."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(WardenError):
    """The named object does not exist."""


class Conflict(WardenError):
    """The request clashes with stored state (for example a GPU owned by another node)."""


class Forbidden(WardenError):
    """The caller's token may not do this."""


class Unavailable(WardenError):
    """The service cannot answer now (database down, too busy); try again after a while."""

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class DeliveryError(WardenError):
    """A notification was not taken: the HTTP ``status`` (None: no answer) and its Retry-After.

    What to do about it is the delivery table's decision (``service.delivery.decide``).
    """

    def __init__(self, message: str, *, status: int | None, retry_after: str | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
