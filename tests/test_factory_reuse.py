"""A factory that returns one env object made beforehand (``serve(lambda: env, ...)``).

The server closes what a factory makes when its client leaves, so such a factory used to hand
the first client a closed env: an ``AsyncVectorEnv`` answered its first reset with gymnasium's
``ClosedEnvironmentError`` (the server had made and closed it at start to check its spaces).
Now the env made at start is kept for the first client (a vector env of processes is started
once, not twice), and a factory that returns an object it returned before is refused with a
message that says what to pass, on every backend. Real servers and real gymnasium envs."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import gymnasium
import numpy as np
import pytest

from transport import api
from transport.envs.echo import EchoEnv
from transport.envs.vector_gym import GymVectorEnv
from transport.errors import TransportError
from transport.generated import pac_env

REUSED = "returned an env object it had returned before"


def _url(scheme: str, tag: str) -> str:
    name = f"reuse-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if scheme == "shm":
        return f"shm://{name}?num_envs=2"
    if scheme in ("http", "zmq+tcp"):
        return f"{scheme}://127.0.0.1:0"
    path = f"/tmp/{name}.sock"
    return (
        f"ipc://{path}".replace("ipc://", "zmq+ipc://") if scheme == "zmq+ipc" else f"unix://{path}"
    )


def _async_cartpole() -> GymVectorEnv:
    vec = gymnasium.vector.AsyncVectorEnv([lambda: gymnasium.make("CartPole-v1")] * 2)
    return GymVectorEnv(vec)


class _Counted:
    """A factory of one object made beforehand (the misuse), counting its calls."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.env


def test_the_first_client_steps_the_vector_env_made_at_start() -> None:
    """``lambda: vec`` over an AsyncVectorEnv: the first client resets and steps it (before: an
    ENV_ERROR with ``ClosedEnvironmentError`` on its first reset), and the server started it
    once (the start check's env is the first client's)."""
    vec = _async_cartpole()
    factory = _Counted(vec)
    server = api.Server(factory, _url("unix", "first"), schema=vec.SCHEMA, num_envs=2).start()
    try:
        with api.connect(server.bound_url, timeout=30) as client:
            first = client.reset(seed=3, copy=True)
            view = client.step(np.array([0, 1]), copy=True)
        assert first.observation.shape == (2, 4)
        assert np.all(view.reward == 1.0)
        assert factory.calls == 1
    finally:
        server.close()
        vec.close()


@pytest.mark.parametrize("scheme", ["unix", "http", "zmq+ipc", "shm"])
def test_a_second_client_is_told_the_factory_returned_one_object_twice(scheme: str) -> None:
    """Once the first client leaves (its envs closed), the next one gets an error saying the
    factory must make a new env per call, not a closed env or a silent hang."""
    vec = _async_cartpole()
    server = api.Server(_Counted(vec), _url(scheme, "second"), schema=vec.SCHEMA, num_envs=2)
    server.start()
    try:
        with api.connect(server.bound_url, timeout=30) as client:
            client.reset(seed=1)
        with pytest.raises(TransportError, match=REUSED):
            with api.connect(server.bound_url, timeout=10) as client:
                client.reset(seed=1)
        with pytest.raises(TransportError, match="pass the object itself"):
            with api.connect(server.bound_url, timeout=10) as client:
                client.reset(seed=1)
    finally:
        server.close()
        vec.close()


def test_one_env_object_for_several_envs_is_refused_at_start() -> None:
    """``lambda: env`` with num_envs=2 would step one object as two envs: over shm (whose
    server makes the first client's envs when it starts) ``Server`` refuses it, naming why."""
    env = EchoEnv()
    with pytest.raises(ValueError, match=REUSED):
        api.Server(_Counted(env), _url("shm", "start"), num_envs=2).start()


_ONE_ECHO = EchoEnv()


def _one_echo() -> EchoEnv:
    """A module-level factory (worker processes can call it) of one object made beforehand."""
    return _ONE_ECHO


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_one_env_object_for_several_envs_of_a_worker_is_refused(scheme: str) -> None:
    """With worker processes each worker made its envs from the factory without the check: two
    envs of one worker stepped one object (before: served, each step moved it twice)."""
    url = _url(scheme, "workers")
    if scheme == "shm":
        url = url.replace("num_envs=2", "num_envs=4")
    with pytest.raises((ValueError, TransportError), match=REUSED):
        server = api.Server(_one_echo, url, schema=pac_env.SCHEMA, num_envs=4, workers=2).start()
        try:
            with api.connect(server.bound_url, timeout=10) as client:
                client.reset()
        finally:
            server.close()


@pytest.mark.parametrize("scheme", ["unix", "http", "zmq+ipc"])
def test_a_factory_of_new_envs_is_called_once_per_env(scheme: str) -> None:
    """The ordinary case: a factory of new envs, two clients one after the other, every env
    made fresh and made once: the start check's env serves the first client, and a client that
    discovers the schema keeps its connection (it used to reconnect, and the server built a
    session and its envs for each connection: 1 + 2 + 2 calls a client, not 2)."""
    made: list[EchoEnv] = []

    def factory() -> EchoEnv:
        made.append(EchoEnv())
        return made[-1]

    url = _url(scheme, "fresh")
    server = api.Server(factory, url, schema=pac_env.SCHEMA, num_envs=2).start()
    try:
        for seed in (1, 2):
            with api.connect(server.bound_url, timeout=30) as client:
                client.reset(seed=seed)
                client.step(np.zeros(2, dtype=np.int64))
        assert len(made) == 4
        assert len({id(env) for env in made}) == 4
    finally:
        server.close()


class _Undeclared:
    """A user's env that declares no schema (no SCHEMA, not a reference env): its results fit
    the default pac_env, which the server tries at start."""

    def __init__(self) -> None:
        self._echo = EchoEnv()

    def spaces(self) -> Any:
        return self._echo.spaces()

    def reset(self, seed: int | None = None) -> Any:
        return self._echo.reset(seed)

    def step(self, action: int) -> Any:
        return self._echo.step(action)


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_an_env_without_a_schema_is_tried_on_the_first_clients_env(scheme: str) -> None:
    """No schema= and none declared: the default schema is tried on the env the start check
    makes (the first client's), not on one more env made for the try and closed (before: 3
    envs made for a first client of 2)."""
    made: list[_Undeclared] = []

    def factory() -> _Undeclared:
        made.append(_Undeclared())
        return made[-1]

    server = api.Server(factory, _url(scheme, "undeclared"), num_envs=2).start()
    try:
        assert server.schema.fingerprint == pac_env.SCHEMA.fingerprint
        with api.connect(server.bound_url, timeout=30) as client:
            client.reset(seed=1)
            client.step(np.zeros(2, dtype=np.int64))
        assert len(made) == 2
    finally:
        server.close()


def test_an_env_whose_results_do_not_fit_the_default_is_refused_at_start() -> None:
    """The same try, failing: a TypeError naming what to pass, and the env it made closed."""
    closed: list[int] = []

    class Other(_Undeclared):
        def reset(self, seed: int | None = None) -> Any:
            return {"score": 1.0}

        def close(self) -> None:
            closed.append(1)

    with pytest.raises(TypeError, match="declares none, so the default schema pac_env was tried"):
        api.Server(Other, _url("unix", "misfit"), num_envs=2)
    assert closed == [1]


class _SlowToClose(EchoEnv):
    """An env whose close takes a while (an AsyncVectorEnv joining its processes, say)."""

    closed: list[int] = []

    def close(self) -> None:
        time.sleep(0.5)
        _SlowToClose.closed.append(1)


@pytest.mark.parametrize("scheme", ["unix", "http"])
@pytest.mark.parametrize("leave", ["before", "during"])
def test_the_envs_are_closed_when_server_close_returns(scheme: str, leave: str) -> None:
    """CI (once): a test closed the AsyncVectorEnv it had served right after ``Server.close()``
    and got EBADF: the connection's thread was still closing the same env. ``close()`` returned
    once the connections were shut down, not once their sessions had closed their envs. It now
    waits for them (``CLOSE_WAIT``), whether the client left before or is still connected."""
    _SlowToClose.closed = []
    server = api.Server(_SlowToClose, _url(scheme, "slowclose"), schema=pac_env.SCHEMA).start()
    client = api.connect(server.bound_url, timeout=10)
    client.reset(seed=1)
    if leave == "before":
        client.close()
    server.close()
    assert _SlowToClose.closed == [1]
    client.close()


@pytest.mark.parametrize("scheme", ["unix", "http", "zmq+ipc", "shm"])
def test_a_clients_envs_are_closed_when_it_leaves_and_a_shared_env_is_not(scheme: str) -> None:
    """Envs a factory made for a client are closed when it leaves (a MuJoCo renderer, an ALE
    instance: before, only a vector env was; ordinary envs waited for the garbage collector).
    zmq has no connection to end: its sessions' envs are closed when the server drops them (it
    closes, or the session is the least recently used over max_sessions). An env instance
    served to every client is left open for the next one."""
    _SlowToClose.closed = []
    url = _url(scheme, "leave").replace("num_envs=2", "num_envs=1")
    server = api.Server(_SlowToClose, url, schema=pac_env.SCHEMA).start()
    try:
        with api.connect(server.bound_url, timeout=10) as client:
            client.reset(seed=1)
        if scheme == "zmq+ipc":
            server.close()
        deadline = time.monotonic() + 10
        while not _SlowToClose.closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _SlowToClose.closed == [1]
    finally:
        server.close()
    _SlowToClose.closed = []
    shared = _SlowToClose()
    server = api.Server(shared, _url(scheme, "shared").replace("num_envs=2", "num_envs=1"))
    server.start()
    try:
        for seed in (1, 2):
            with api.connect(server.bound_url, timeout=10) as client:
                client.reset(seed=seed)
                client.step(1)
        time.sleep(0.3)
        assert _SlowToClose.closed == []
    finally:
        server.close()
