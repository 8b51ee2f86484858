"""connect_many: one batch over several real servers (zmq first, unix next to it)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import transport
import transport.api as api
from transport.envs.echo import EchoEnv
from transport.errors import ConnectError, EnvError, PeerGoneError, RemoteError
from transport.multi import BatchError, MultiClient
from transport.protocol import ErrorCode
from transport.runtime.env import Spaces

from .servers import ServerProcess, free_port, unique_unix_url


def zmq_url(kind: str) -> str:
    if kind == "ipc":
        return f"zmq+ipc://{tempfile.gettempdir()}/transport-multi-{uuid.uuid4().hex[:12]}.sock"
    return f"zmq+tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def three_servers() -> Iterator[list[ServerProcess]]:
    procs = [
        ServerProcess(zmq_url("ipc"), env="echo", num_envs=2),
        ServerProcess(zmq_url("tcp"), env="echo", num_envs=1),
        ServerProcess(unique_unix_url(), env="echo", num_envs=3),
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.__exit__(None, None, None)


def test_one_batch_over_zmq_and_unix(three_servers: list[ServerProcess]) -> None:
    urls = [proc.url for proc in three_servers]
    with transport.connect_many(urls, timeout=5) as multi:
        assert isinstance(multi, MultiClient)
        assert multi.num_envs == 6
        assert multi.env_slices == [slice(0, 2), slice(2, 3), slice(3, 6)]
        assert multi.spaces() == Spaces(612, 92)
        first = multi.reset(seed=10)
        assert first.observation.shape == (6, 612)
        for step in range(1, 4):
            actions = np.arange(6) + 10 * step
            result = multi.step(actions)
            assert result.observation.shape == (6, 612)
            assert (result.observation[:, 0] == actions).all()
            assert (result.observation[:, 1] == step).all()
            assert result.observation.ctypes.data % 16 == 0
        kept = multi.step(list(range(6)), copy=True)
        multi.step([5] * 6)
        assert kept.observation[3, 0] == 3.0  # copy=True survives the next step


def test_shm_servers_join_a_batch_through_the_same_channel_interface() -> None:
    shm = f"shm://test-multi-{uuid.uuid4().hex[:12]}?num_envs=2"
    with (
        ServerProcess(shm, env="echo", num_envs=2) as a,
        ServerProcess(unique_unix_url(), env="echo", num_envs=1) as b,
        transport.connect_many([a.url, b.url], timeout=5) as multi,
    ):
        multi.reset(seed=1)
        result = multi.step([7, 8, 9])
        np.testing.assert_array_equal(result.observation[:, 0], [7, 8, 9])


def test_seeds_are_global_env_ids() -> None:
    with (
        ServerProcess(zmq_url("ipc"), env="pac", num_envs=2) as a,
        ServerProcess(zmq_url("tcp"), env="pac", num_envs=3) as b,
    ):
        with transport.connect_many([a.url, b.url], timeout=5) as multi:
            batch = multi.reset(seed=100, copy=True)
        with api.connect(b.url, timeout=5) as direct:
            alone = direct.reset(seed=102)  # b's envs are global envs 2..4
            assert alone.record.tobytes() == batch.record[2:].tobytes()


def test_a_refused_action_is_attributed_to_its_server(three_servers: list[ServerProcess]) -> None:
    urls = [proc.url for proc in three_servers]
    with transport.connect_many(urls, timeout=5) as multi:
        multi.reset()
        actions = [1, 2, 3, 4, 5, 6]
        actions[2] = 92  # the zmq+tcp server's only env
        with pytest.raises(BatchError) as info:
            multi.step(actions)
        error = info.value
        assert error.env_ids == [2]
        assert error.urls == [urls[1]]
        (failure,) = error.failures
        assert isinstance(failure.error, RemoteError)
        assert failure.error.code == ErrorCode.INVALID_ACTION
        assert "envs 2 at " + urls[1] in str(error)
        assert error.results is not None
        assert error.results.observation[5, 0] == 6.0  # the other servers did step
        # every server is still in step: the next batch works
        assert (multi.step([7] * 6).observation[:, 0] == 7).all()


class RaisesOnAction(EchoEnv):
    """Echo, except that action 13 raises inside the env."""

    def step_into(self, action: int, out: np.ndarray) -> None:
        if action == 13:
            raise RuntimeError("unlucky action")
        super().step_into(action, out)


def test_an_env_error_is_attributed_to_the_global_env_id() -> None:
    urls = [unique_unix_url(), unique_unix_url()]
    with (
        api.Server(EchoEnv, urls[0], num_envs=2).start(),
        api.Server(RaisesOnAction, urls[1], num_envs=3).start(),
        transport.connect_many(urls, timeout=5) as multi,
    ):
        multi.reset()
        with pytest.raises(BatchError) as info:
            multi.step([1, 2, 3, 13, 5])  # global env 3 is env 1 of the second server
        error = info.value
        assert error.env_ids == [3]
        (failure,) = error.failures
        assert failure.env_ids == range(2, 5) and failure.failed_env_ids == (3,)
        assert isinstance(failure.error, EnvError) and failure.error.env_id == 1  # server-local
        assert f"env 3 (of envs 2-4) at {urls[1]}: EnvError" in str(error)
        with pytest.raises(BatchError) as info:
            multi.step([13, 2, 13, 4, 13])  # two envs of the second server fail
        assert info.value.env_ids == [2, 4]  # the first server's env 0 is fine: echo
        assert (multi.step([7] * 5).observation[:, 0] == 7).all()


def test_a_dead_server_is_attributed_and_the_rest_answer() -> None:
    a = ServerProcess(zmq_url("ipc"), env="echo", num_envs=2)
    b = ServerProcess(zmq_url("tcp"), env="echo", num_envs=2)
    try:
        with transport.connect_many([a.url, b.url], timeout=2) as multi:
            multi.reset()
            os.kill(b.proc.pid, signal.SIGKILL)
            b.proc.wait(5)
            started = time.monotonic()
            with pytest.raises(BatchError) as info:
                multi.step([1, 2, 3, 4])
            assert time.monotonic() - started < 2.5
            assert info.value.env_ids == [2, 3]
            assert isinstance(info.value.failures[0].error, PeerGoneError)
            assert info.value.results is not None
            assert list(info.value.results.observation[:2, 0]) == [1.0, 2.0]
    finally:
        a.__exit__(None, None, None)
        b.kill()


def test_unreachable_servers_are_listed() -> None:
    with ServerProcess(zmq_url("ipc"), env="echo") as live:
        missing = zmq_url("ipc")
        with pytest.raises(BatchError) as info:
            transport.connect_many([live.url, missing], timeout=0.5)
        assert info.value.urls == [missing]
        assert isinstance(info.value.failures[0].error, ConnectError)


class SlowEnv(EchoEnv):
    """Echo with a sleep per step (the GIL is released: in-process servers overlap)."""

    def step_into(self, action: int, out: np.ndarray) -> None:
        time.sleep(0.3)
        super().step_into(action, out)


def test_zmq_requests_are_pipelined_across_servers() -> None:
    servers = [api.Server(SlowEnv, zmq_url("ipc")).start() for _ in range(3)]
    try:
        with transport.connect_many([s.bound_url for s in servers], timeout=5) as multi:
            multi.reset()
            multi.step([1, 2, 3])
            started = time.monotonic()
            result = multi.step([4, 5, 6])
            elapsed = time.monotonic() - started
            assert list(result.observation[:, 0]) == [4.0, 5.0, 6.0]
            assert elapsed < 0.6, f"{elapsed:.2f} s: the three 0.3 s steps did not overlap"
    finally:
        for server in servers:
            server.close()
