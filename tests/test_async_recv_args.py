"""What ``send``'s env ids and ``recv``'s batch size may be, and what a timed-out ``recv`` says.

``send([a], [1.7])`` stepped env 1 and ``send([a], [True])`` env 1 too (the ids were ``int()``-ed;
the protocol and the Node client refuse them); ``recv(0)`` took the default batch size and
``recv(-1)`` was NumPy's OverflowError. A ``recv`` that timed out over a socket backend said
"retry", but the envs it waited for are taken off the server when they finish and their late
results are dropped (another recv gets ASYNC_STATE); shm keeps them, and says retry. Real
servers in process (unix, shm), a real client."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import transport
from transport.envs.echo import EchoEnv
from transport.errors import TransportTimeoutError

from .servers import unique_unix_url

NUM_ENVS = 2
SLOW_S = 1.5
LOST = "they stepped, but their results are lost"


class SlowOnOne(EchoEnv):
    """The echo env whose step with action 1 takes SLOW_S."""

    def step_into(self, action: int, out: np.ndarray) -> None:
        if action == 1:
            time.sleep(SLOW_S)
        return super().step_into(action, out)


def serve(scheme: str, workers: int = 0) -> Any:
    url = unique_unix_url() if scheme == "unix" else f"shm://recvargs-{uuid.uuid4().hex[:8]}"
    return transport.Server(SlowOnOne, url, num_envs=NUM_ENVS, workers=workers).start()


@pytest.fixture(scope="module")
def unix_url() -> Iterator[str]:
    server = serve("unix")
    try:
        yield server.bound_url
    finally:
        server.close()


@pytest.mark.parametrize("ids", [[1.7], [True], ["1"], [np.float32(1)]], ids=repr)
def test_send_refuses_env_ids_that_are_not_integers(unix_url: str, ids: list[Any]) -> None:
    with transport.connect(unix_url, timeout=10) as client:
        client.async_reset(0)
        client.recv()
        with pytest.raises(TypeError, match=r"send\(\): env ids are integers, not"):
            client.send([0], ids)
        client.send([0], np.array([1]))  # nothing was sent before: env 1 is free
        assert client.recv().env_ids.tolist() == [1]


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "2", 1 << 32], ids=repr)
def test_recv_refuses_batch_sizes_that_are_not_one_or_more(unix_url: str, size: Any) -> None:
    with transport.connect(unix_url, timeout=10) as client:
        client.async_reset(0)
        with pytest.raises(ValueError, match=r"recv\(batch_size=.*\): a batch size is an integer"):
            client.recv(size)
        assert sorted(client.recv(None).env_ids.tolist()) == [0, 1]  # the default: N


def short_timeout(client: Any, seconds: float) -> None:
    """The client's timeout from now on (a test's shortcut: connect has the only public one,
    and the first requests must wait for the worker processes to start)."""
    channel = client.channel
    channel.timeout = seconds
    if hasattr(channel, "_timeout_ns"):  # shm keeps it in ns for its C waits
        channel._timeout_ns = int(seconds * 1e9)
    if hasattr(channel, "framed"):  # unix: the socket's own timeout
        channel.framed.timeout = seconds
        channel.framed.sock.settimeout(seconds)


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_a_timed_out_recv_says_whether_its_results_are_lost(scheme: str) -> None:
    server = serve(scheme, workers=1)  # the envs step in a worker: SEND is answered at once
    try:
        with transport.connect(server.bound_url, timeout=30) as client:  # workers start
            client.async_reset(0)
            client.recv()
            short_timeout(client, 0.3)
            client.send([1], [0])  # env 0 steps for SLOW_S
            with pytest.raises(TransportTimeoutError) as caught:
                client.recv(1)
            text = str(caught.value)
            if scheme == "unix":
                assert LOST in text and "retry" not in text, text
            else:  # shm keeps the late result for the next recv: retry is right there
                assert LOST not in text and "retry" in text, text
                time.sleep(SLOW_S)
                assert client.recv(1).env_ids.tolist() == [0]
    finally:
        server.close()
