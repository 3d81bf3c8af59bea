"""Retry timing for notifications: jittered exponential backoff and a per-channel rate limit."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def retry_delay_seconds(
    attempt: int,
    *,
    retry_after_seconds: float | None = None,
    base_seconds: float = 2.0,
    cap_seconds: float = 600.0,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): full jitter, Retry-After floor."""
    rng = rng or random.Random()
    ceiling = min(cap_seconds, base_seconds * 2 ** max(attempt - 1, 0))
    # Half fixed, half random ("equal jitter") so retries spread out but never come at once.
    delay: float = ceiling / 2 + rng.uniform(0, ceiling / 2)
    if retry_after_seconds is not None:
        delay = max(delay, min(retry_after_seconds, 3600.0))
    return delay


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
