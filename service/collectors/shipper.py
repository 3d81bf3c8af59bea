"""Sending encoded batches to the central service (what an answer means: ``service.delivery``)."""

from __future__ import annotations

import email.utils
import json
from dataclasses import dataclass

import httpx

from service.collectors.transport import (
    HttpxTransport,
    StdlibTransport,
    Transport,
    TransportError,
)
from service.vocabulary import job_path


@dataclass(frozen=True, slots=True)
class Reply:
    """Central's answer to one POST: status (None when none came), text and Retry-After."""

    status: int | None
    message: str
    retry_after: str | None = None


class Shipper:
    """POSTs gzipped batches to ``{central_url}/api/v1/ingest`` with the node's token."""

    def __init__(
        self,
        *,
        central_url: str,
        token: str | None,
        client: httpx.Client | None = None,
        transport: Transport | None = None,
        timeout_seconds: float = 30.0,
    ) -> None:
        self.url = central_url.rstrip("/") + "/api/v1/ingest"
        # X-Request-Timeout: central answers 503 (nothing stored) rather than keep a batch
        # waiting past it, or store one this agent has given up on and will send again.
        headers = {
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "X-Request-Timeout": f"{timeout_seconds:g}",
        }
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.headers = headers
        if transport is None:
            transport = (
                HttpxTransport(client)
                if client is not None
                else StdlibTransport(timeout_seconds=timeout_seconds)
            )
        self.transport = transport

    def send(self, body: bytes) -> Reply:
        """One delivery attempt of a gzipped batch."""
        # Date: this node's clock at sending; the central compares it with its own, and its
        # ladder never acts on samples from a node whose clock is off (docs/actions.md).
        headers = self.headers | {"Date": email.utils.formatdate(usegmt=True)}
        try:
            status, text, retry_after = self.transport.post(self.url, body, headers)
        except TransportError as exc:
            return Reply(None, str(exc))
        return Reply(status, text[:10_000], retry_after)

    def end_job(self, job_id: str, ended_at: str) -> Reply:
        """One attempt at ``PATCH /api/v1/jobs/{job_id}`` with ``ended_at`` (a job's end on this
        node, as the Slurm epilog recorded it)."""
        url = self.url.removesuffix("/ingest") + job_path(job_id)
        headers = {k: v for k, v in self.headers.items() if k != "Content-Encoding"}
        body = json.dumps({"ended_at": ended_at}).encode()
        try:
            status, text, retry_after = self.transport.post(url, body, headers, method="PATCH")
        except TransportError as exc:
            return Reply(None, str(exc))
        return Reply(status, text[:10_000], retry_after)

    def close(self) -> None:
        """Close the HTTP connection."""
        self.transport.close()
