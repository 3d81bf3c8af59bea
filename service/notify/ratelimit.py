"""A per-channel rate limit for notifications (retry timing is ``service.delivery``'s)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RateLimiter:
    """A token bucket per channel: at most ``rate`` messages a second with a burst of ``burst``."""

    burst: float = 1.0
    _state: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (tokens, at)

    def wait_seconds(self, channel: str, rate: float, now: float) -> float:
        """Seconds until ``channel`` may send one more message (0 means now)."""
        tokens, at = self._state.get(channel, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * rate)
        self._state[channel] = (tokens, now)
        return 0.0 if tokens >= 1 else (1 - tokens) / rate

    def take(self, channel: str, now: float) -> None:
        """Spend one message of ``channel``'s budget (after ``wait_seconds`` said 0)."""
        tokens, _ = self._state.get(channel, (self.burst, now))
        self._state[channel] = (tokens - 1, now)
