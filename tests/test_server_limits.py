"""Server limits (issue 17 item 1): bodies are read as bytes arrive (the server's RSS from
/proc/PID/status, Python and Node servers, unix and http, real processes and sockets) and the
limits are validated at start. The connection cap and the idle and read timeouts are contract
checks (transport/testing/checks_limits.py), run over every socket backend by test_contract."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import transport
from transport.testing import ServeProcess, unique_url
from transport.testing.checks_limits import (
    MIB,
    declare_body,
    raw_connect,
    rss_mib,
)

CASES = [
    ("unix", "python"),
    ("http", "python"),
    ("unix", "node"),
    ("http", "node"),
]


@pytest.fixture(params=CASES, ids=["-".join(case) for case in CASES])
def case(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


def start(scheme: str, lang: str, *flags: str, max_body: int = 64 * MIB) -> ServeProcess:
    return ServeProcess(
        unique_url(scheme),
        "pac_env",
        lang=lang,
        seed=1,
        max_body=max_body,
        extra_args=flags,
    )


@pytest.fixture
def stopper() -> Iterator[list[ServeProcess]]:
    servers: list[ServeProcess] = []
    yield servers
    for server in servers:
        server.stop()
        assert not server.leftovers()


def test_declared_bodies_cost_no_memory(case: tuple[str, str], stopper: list[ServeProcess]) -> None:
    """24 connections that each declare a 60 MiB body and send one byte of it do not grow the
    server by their declared sizes (before the fix: +840-870 MiB on the Python servers)."""
    scheme, lang = case
    server = start(scheme, lang)
    stopper.append(server)
    with transport.connect(server.url) as client:  # warm up: one session, one step
        client.reset()
    before = rss_mib(server.pid)
    socks = [raw_connect(server.url) for _ in range(24)]
    for sock in socks:
        sock.sendall(declare_body(server.url, 60 * MIB))
    time.sleep(1.0)
    grown = rss_mib(server.pid) - before
    for sock in socks:
        sock.close()
    assert grown < 100, f"24 declared 60 MiB bodies grew the server by {grown:.0f} MiB"
    with transport.connect(server.url) as client:
        client.reset()


def test_memory_does_not_ratchet(case: tuple[str, str], stopper: list[ServeProcess]) -> None:
    """300 connections in turn, each declaring 1-60 MiB and closing: RSS stays flat."""
    scheme, lang = case
    server = start(scheme, lang)
    stopper.append(server)
    with transport.connect(server.url) as client:
        client.reset()
    before = rss_mib(server.pid)
    for i in range(300):
        with raw_connect(server.url) as sock:
            sock.sendall(declare_body(server.url, (1 + i % 60) * MIB))
    time.sleep(0.5)
    grown = rss_mib(server.pid) - before
    assert grown < 100, f"300 closed connections left the server {grown:.0f} MiB larger"


@pytest.mark.parametrize("lang", ["python", "node"])
@pytest.mark.parametrize(
    "flag,value", [("--max-connections", "0"), ("--idle-timeout", "-1"), ("--read-timeout", "0")]
)
def test_non_positive_limits_exit_2(lang: str, flag: str, value: str) -> None:
    """A non-positive limit is refused at start: exit 2, one line naming the flag."""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "transport.tools.serve_cli",
            unique_url("unix"),
            "--lang",
            lang,
            flag,
            value,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc
    assert flag in proc.stderr.strip().splitlines()[-1], proc.stderr


def test_server_limits_validate() -> None:
    """ServerLimits refuses non-positive values with a ValueError naming the field."""
    for field in ("max_connections", "idle_timeout", "read_timeout"):
        with pytest.raises(ValueError, match=field):
            transport.ServerLimits(**{field: 0})
