"""The reference server's socket: a backlog for a burst of connects, its port never shared, a client
that went away is one line and not a traceback (issue 14)."""

from __future__ import annotations

import socket

import pytest

from cptest.reference import server
from cptest.reference.server_args import DEFAULT_MAX_RUNNING


def test_the_listen_backlog_holds_the_largest_declared_concurrency() -> None:
    assert server.Server.request_queue_size >= 2 * DEFAULT_MAX_RUNNING
    assert server.Server.allow_reuse_port is False


def test_a_client_gone_before_its_answer_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with server.Server(("127.0.0.1", 0), server.handler_for(None)) as httpd:  # type: ignore[arg-type]
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            httpd.handle_error(None, ("127.0.0.1", 4242))
    out = capsys.readouterr()
    assert "went away before its answer was written" in out.out and "Traceback" not in out.out + out.err


def test_a_second_server_cannot_bind_the_port_of_the_first() -> None:
    with server.Server(("127.0.0.1", 0), server.handler_for(None)) as first:  # type: ignore[arg-type]
        port = first.server_address[1]
        with pytest.raises(OSError, match="in use"):
            server.Server(("127.0.0.1", port), server.handler_for(None))  # type: ignore[arg-type]
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
