"""The test suite's free ports: under pytest-xdist each worker picks from its own block below
the kernel's ephemeral range, a port at a time, skipping ports something holds."""

from __future__ import annotations

import socket

import pytest

from tests import support


def test_a_worker_picks_from_its_own_block_and_never_the_same_port_twice_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setattr(support, "_next_port", [])
    ports = [support.free_port() for _ in range(5)]
    assert all(23000 <= p < 26000 for p in ports), ports
    assert len(set(ports)) == 5


def test_a_port_something_holds_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    target = next(
        p for p in range(26500, 28999) if support._bindable(p) and support._bindable(p + 1)
    )
    with socket.socket() as held:
        held.bind(("127.0.0.1", target))
        held.listen()
        monkeypatch.setattr(support, "_next_port", [target])  # the walk is at a held port
        assert support.free_port() == target + 1


def test_outside_xdist_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    port = support.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free right now
