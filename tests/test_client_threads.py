"""One client, two threads (a misuse a thread pool makes easily).

Before: the second thread's request interleaved with the first's on the wire or in the shm
slots: ``ProtocolError`` (msg_id does not echo the request), ``BadFrameError``, ``PeerGoneError``
(bad file descriptor) or a 5 s timeout, and a step could run with the other thread's actions.
Now a call made while another thread's call on the same client is in flight is refused at once
with a ``TransportError`` that says what to do, nothing is sent for it, and every call that ran
got its own results. Real servers, every backend."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

import numpy as np
import pytest

import transport
from transport.envs.echo import EchoEnv
from transport.errors import TransportError
from transport.generated import pac_env

IN_USE = "another thread is in a call on this client"


def _url(scheme: str) -> str:
    tag = f"threads-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if scheme == "shm":
        return f"shm://{tag}?num_envs=2"
    if scheme == "http":
        return "http://127.0.0.1:0"
    return f"{scheme}:///tmp/{tag}.sock"


def _two_threads(client: Any, num_envs: int, rounds: int) -> tuple[int, list[str], list[str]]:
    """Threads 1 and 2 step ``client`` ``rounds`` times each with actions all k: (steps that
    ran, refusals, steps whose results were not their own action's)."""
    refused: list[str] = []
    wrong: list[str] = []
    ran = [0]

    def work(k: int) -> None:
        actions = np.full(num_envs, k, dtype=np.int64)
        for _ in range(rounds):
            try:
                view = client.step(actions, copy=True)
            except TransportError as exc:
                refused.append(str(exc))
                continue
            ran[0] += 1
            # the echo env: observation[0] is the action, the reward a quarter of it
            if not (np.all(view.observation[:, 0] == k) and np.all(view.reward == k / 4)):
                wrong.append(f"thread {k}: {view.observation[:, 0]} {view.reward}")

    threads = [threading.Thread(target=work, args=(k,)) for k in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    view = client.step(np.full(num_envs, 3), copy=True)  # the client goes on
    assert np.all(view.observation[:, 0] == 3)
    assert refused, "the two threads never overlapped: nothing was tested"
    assert all(IN_USE in text and "one client per thread" in text for text in refused), refused
    return ran[0], refused, wrong


@pytest.mark.parametrize("scheme", ["unix", "zmq+ipc", "http", "shm"])
def test_a_second_thread_is_refused_and_every_step_gets_its_own_results(scheme: str) -> None:
    server = transport.Server(EchoEnv, _url(scheme), schema=pac_env.SCHEMA, num_envs=2).start()
    try:
        with transport.connect(server.bound_url, timeout=10) as client:
            client.reset(seed=1)
            ran, refused, wrong = _two_threads(client, 2, 200)
    finally:
        server.close()
    assert wrong == []
    assert ran + len(refused) == 400


def test_a_batch_of_servers_refuses_a_second_thread_too() -> None:
    """``connect_many``: its call takes every server's client (the same rule), so a second
    thread is refused there as well, and each step that ran got its own results."""
    servers = [
        transport.Server(EchoEnv, _url("unix"), schema=pac_env.SCHEMA, num_envs=2).start()
        for _ in range(2)
    ]
    try:
        with transport.connect_many([s.bound_url for s in servers], timeout=10) as batch:
            batch.reset(seed=1)
            ran, refused, wrong = _two_threads(batch, 4, 150)
    finally:
        for server in servers:
            server.close()
    assert wrong == []
    assert ran + len(refused) == 300
