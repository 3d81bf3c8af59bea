"""The evaluator's runtime in one process: rounds while this replica leads, then sending."""

from __future__ import annotations

from service.context import ServiceContext
from service.db.leader import LeaderLock
from service.usecases.evaluation.rounds import RoundResult, StateCache, evaluate_once
from service.usecases.outbox import Dispatcher


class Alerting:
    """The evaluator's runtime in one process: the leader lock and the dispatcher."""

    def __init__(self, ctx: ServiceContext, dispatcher: Dispatcher | None = None) -> None:
        self.ctx = ctx
        self.leader = LeaderLock(ctx.engine)
        self.dispatcher = dispatcher or Dispatcher(ctx)
        self.cache = StateCache()
        self._epoch = -1

    def evaluate_tick(self) -> RoundResult | None:
        """If this replica is the leader: evaluate, then send what that queued."""
        leader = self.leader.check()
        self.ctx.telemetry.evaluator_leader.set(1 if leader else 0)
        if leader and self.leader.acquisitions != self._epoch:
            self.cache.clear()  # another replica may have written alerts meanwhile
            self._epoch = self.leader.acquisitions
        if not leader:
            return None
        result = evaluate_once(self.ctx, cache=self.cache)
        if result.notifications:
            self.dispatcher.drain()
        return result

    def deliver_tick(self) -> int:
        """If this replica is the leader: send due deliveries (retries, rate-limited ones)."""
        if not self.leader.check():
            return 0
        return self.dispatcher.drain()

    def close(self) -> None:
        """Release the leader lock and the HTTP client."""
        self.leader.release()
        self.dispatcher.client.close()
