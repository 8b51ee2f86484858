"""Asynchronous batches over shm wake the client once per RECV, not once per finished env
(issue 23 item 5; docs/shm.md "One wake per RECV").

A server whose envs run in worker processes answers each env's slot as its worker finishes. A
RECV of k envs that finish at different times used to wake the client k times (each publish
woke it, it counted, and slept again): a context switch per env on a machine whose cores the
workers need. The client now writes the RECV wake hint (final area 0, byte 4) before it sleeps
and the server wakes it only once the RECV can end. Real server processes (Python and Node),
real worker processes / threads, real POSIX shm; the client's FUTEX_WAIT count is asserted,
never a time.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport import native
from transport.backends.shm.channel import ShmChannel
from transport.envs.echo import EchoEnv
from transport.errors import TransportTimeoutError

from .servers import NODE_SERVER, ROOT, ServerProcess, require_lang

STEP_UNIT_S = 0.012
"""The staggered env's step takes ``action`` x this (env 0 of a round 1 unit, the last 5)."""
ROUNDS = 5
NUM_ENVS = 6
WORKERS = 3  # envs (0, 1), (2, 3), (4, 5): the envs sent each round are in different workers
SENT = [0, 2, 4]
ACTIONS = [1, 3, 5]  # they finish ~2 units apart: the client sleeps in between


class StaggeredEnv(EchoEnv):
    """The echo env whose step sleeps ``action`` x STEP_UNIT_S (off the CPU: the workers of
    the other envs run meanwhile), so that envs sent together finish one after the other."""

    def step_into(self, action: int, out: np.ndarray) -> None:
        import time

        time.sleep(int(action) * STEP_UNIT_S)
        super().step_into(action, out)


NODE_ENV = ROOT / "node_bridge" / "dist" / "test" / "shm_async_wakes_env.js"


@pytest.fixture(scope="module", params=["python", "node"])
def server(request: Any) -> Iterator[ServerProcess]:
    """One staggered-env server per language, 6 envs in 3 workers (processes / threads)."""
    lang = request.param
    require_lang(lang)
    url = f"shm://test-wakes-{uuid.uuid4().hex[:12]}?num_envs={NUM_ENVS}"
    if lang == "python":
        env = "tests.test_shm_async_wakes:StaggeredEnv"
    else:
        if not NODE_ENV.is_file() or not NODE_SERVER.is_file():
            pytest.skip("the Node test env is not built (npx tsc -p node_bridge)")
        env = f"{NODE_ENV}:makeStaggeredEnv"
    extra = ["--schema", str(ROOT / "schema" / "pac_env.toml"), "--workers", str(WORKERS)]
    with ServerProcess(url, env=env, lang=lang, num_envs=NUM_ENVS, extra=extra) as s:
        yield s


def _connect(server: ServerProcess) -> tuple[Any, ShmChannel]:
    # slices longer than a round: every wake-up the test counts is a publish's, none a timeout's
    client = api.connect(server.url + "&slice_ms=2000", timeout=30)
    channel = client.channel
    assert isinstance(channel, ShmChannel)
    return client, channel


@pytest.fixture(scope="module")
def connected(server: ServerProcess) -> Iterator[tuple[Any, ShmChannel]]:
    """One client per server (a new lease costs a new worker pool: seconds on a busy machine);
    the last test ends it."""
    client, channel = _connect(server)
    client.reset(seed=1)
    try:
        yield client, channel
    finally:
        client.close()


def test_a_recv_of_staggered_envs_wakes_the_client_once(
    connected: tuple[Any, ShmChannel],
) -> None:
    """SEND 3 envs that finish ~24 ms apart, RECV all 3: one sleep per RECV (two when a publish
    lands between the client's look and its sleep), where there were three."""
    client, channel = connected
    _, sleeps_before = channel.wait_stats
    for _ in range(ROUNDS):
        client.send(ACTIONS, SENT)
        got = client.recv(len(SENT))
        assert sorted(got.env_ids.tolist()) == SENT
        assert got.results.observation[:, 0].tolist() == [  # echo: observation[0] = action
            float(ACTIONS[SENT.index(i)]) for i in got.env_ids.tolist()
        ]
    _, sleeps = channel.wait_stats
    sleeps -= sleeps_before
    assert sleeps <= 2 * ROUNDS, f"{sleeps} sleeps for {ROUNDS} RECVs of {len(SENT)} envs"
    assert channel.region.recv_hint is not None
    assert channel.region.recv_hint[0] == 0  # a RECV leaves no hint behind


def test_a_recv_of_fewer_than_in_flight_wakes_once_for_its_want(
    connected: tuple[Any, ShmChannel],
) -> None:
    """3 in flight, RECV(2) then RECV(1): each wakes once (the first when its second env is
    answered, not at the first), and each env comes back once."""
    client, channel = connected
    _, sleeps_before = channel.wait_stats
    for _ in range(ROUNDS):
        client.send(ACTIONS, SENT)
        first = client.recv(2).env_ids.tolist()
        last = client.recv(1).env_ids.tolist()
        assert len(first) == 2 and len(last) == 1
        assert sorted(first + last) == SENT
    _, sleeps = channel.wait_stats
    sleeps -= sleeps_before
    assert sleeps <= 2 * ROUNDS + 2, f"{sleeps} sleeps for {2 * ROUNDS} RECVs"


def test_a_recv_timeout_still_ends_a_hinted_wait(connected: tuple[Any, ShmChannel]) -> None:
    """A RECV whose envs do not finish in time still times out (the slices, not the hint,
    bound every sleep), and its envs stay in flight for the next RECVs."""
    client, channel = connected
    ctx = channel._ctx
    slice_ns = ctx.slice_ns
    ctx.slice_ns = int(20e6)
    channel.timeout, channel._timeout_ns = 0.05, int(0.05e9)  # RECV's timeout only
    try:
        client.send([40, 1, 1], SENT)  # env 0 takes 40 units (~0.5 s): RECV(3) times out
        with pytest.raises(TransportTimeoutError):
            client.recv(3)
        back: list[int] = []
        for _ in range(400):  # bounded: ~0.05 s a try
            try:
                back += client.recv(3 - len(back)).env_ids.tolist()
            except TransportTimeoutError:
                continue
            if len(back) == len(SENT):
                break
        assert sorted(back) == SENT
    finally:
        ctx.slice_ns = slice_ns
        channel.timeout, channel._timeout_ns = 30, int(30e9)


def test_a_new_client_after_a_hinting_one_is_woken(
    server: ServerProcess, connected: tuple[Any, ShmChannel]
) -> None:
    """A hint a client left behind (it died in a RECV) does not hold back the wakes of the
    next client, which may be an older one that never writes the hint: the server clears it
    for a new lease. (Last: it ends the module's client.)"""
    connected[0].close()
    client, channel = _connect(server)
    with client:
        channel._ctx.recv_hint = native.ffi.NULL  # behave as an older client: no hint written
        assert channel.region.recv_hint is not None
        channel.region.recv_hint[0] = len(SENT) + 1  # stale, as a dead client left it
        client.reset(seed=4)  # the new lease: the server clears the hint
        assert channel.region.recv_hint[0] == 0
        for _ in range(2):
            client.send(ACTIONS, SENT)
            assert sorted(client.recv(3).env_ids.tolist()) == SENT
