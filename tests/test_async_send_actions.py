"""Asynchronous ``send`` applies step's action rule (docs/client.md, "Actions": the shape
(K, *S) for K env ids, no float into an integer field, no value its field cannot hold), with the
same ActionError texts naming ``send()``, before any bytes move, over unix, zmq+ipc and shm;
correct sends deliver exactly the values given. Over shm a send before any reset is refused at
``send`` (NOT_RESET), as over unix. Action errors name a Discrete space's range and a
gymnasium-derived integer Box as the Box it is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import transport.api as api
from transport.actions import describe_action_space
from transport.errors import ActionError, RemoteError
from transport.gym import RemoteEnv
from transport.gym_schema import schema_of_spaces
from transport.gym_serve import gym_server
from transport.protocol import ErrorCode

from .servers import ServerProcess, require_lang, unique_url

BACKENDS = ["unix", "zmq+ipc", "shm"]
N = 2
BOX = "Box(-1.0, 1.0, (2,), float32)"
LOCK = "MultiDiscrete([3, 4, 5])"


def nothing_in_flight(client: Any) -> None:
    """recv says nothing is in flight: every refused send sent nothing."""
    with pytest.raises(RemoteError) as info:
        client.recv(N)
    assert info.value.code == ErrorCode.ASYNC_STATE, str(info.value)


def refused(call: Any, *parts: str) -> str:
    with pytest.raises(ActionError) as info:
        call()
    text = str(info.value)
    assert text.startswith("send(): "), text
    for part in parts:
        assert part in text, f"{part!r} not in {text!r}"
    return text


def row_bytes(record: Any, k: int) -> bytes:
    """Row ``k``'s fields' bytes (not the padding between them)."""
    return b"".join(np.ascontiguousarray(record[name][k]).tobytes() for name in record.dtype.names)


def rows_by_id(got: Any) -> dict[int, bytes]:
    record = got.results.record
    return {int(i): row_bytes(record, k) for k, i in enumerate(got.env_ids.tolist())}


def lockstep_rows(url: str, actions: np.ndarray, seed: int = 5) -> dict[int, bytes]:
    """The result of each env after a reset(seed) and one lock-step step(actions)."""
    with api.connect(url, timeout=20) as client:
        client.reset(seed=seed)
        record = client.step(actions).record
        return {i: row_bytes(record, i) for i in range(N)}


def async_rows(url: str, actions: Any, ids: list[int], seed: int = 5) -> dict[int, bytes]:
    """The same through async_reset(seed), send(actions, ids) and recv."""
    with api.connect(url, timeout=20) as client:
        client.async_reset(seed)
        while len(client.recv(N).env_ids) < N:
            pass
        client.send(actions, ids)
        out: dict[int, bytes] = {}
        while len(out) < len(ids):
            out.update(rows_by_id(client.recv(N, copy=True)))
        return out


@pytest.fixture(scope="module", params=BACKENDS)
def servers(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """Python servers of the reference envs reach (Box), lock (MultiDiscrete), echo (Discrete)."""
    backend = str(request.param)
    with (
        ServerProcess(unique_url(backend), env="reach", num_envs=N) as reach,
        ServerProcess(unique_url(backend), env="lock", num_envs=N) as lock,
        ServerProcess(unique_url(backend), env="echo", num_envs=N) as echo,
    ):
        yield {"reach": reach.url, "lock": lock.url, "echo": echo.url}


def test_send_takes_steps_shapes_for_k_env_ids(servers: dict[str, str]) -> None:
    url = servers["reach"]
    head = f"is not an action for {BOX} ({N} env ids): "
    want = "pass one action per env id: an array of shape (2, 2)"
    with api.connect(url, timeout=20) as client:
        client.async_reset(1)
        while len(client.recv(N).env_ids) < N:
            pass
        # one row for two envs was broadcast to both; (2, 1) was broadcast along the row
        text = refused(lambda: client.send(np.array([0.5, -0.5], np.float32), [0, 1]), head, want)
        assert text == f"send(): ndarray of shape (2,), dtype float32 {head}{want}"
        refused(lambda: client.send(np.array([[0.25], [0.5]], np.float32), [0, 1]), head, want)
        refused(lambda: client.send(0.5, [0, 1]), "float 0.5 " + head, want)
        refused(lambda: client.send(np.zeros((3, 2)), [0, 1]), "expected 2 actions, got 3; " + want)
        refused(lambda: client.send([[0.1, 0.2], [0.3]], [0, 1]), "not numbers of one shape")
        refused(lambda: client.send(np.zeros(2), [1]), "(1 env id): ", "shape (1, 2)")
        refused(lambda: client.send(["a", "b"], [0, 1]), "its values are not numbers")
        nothing_in_flight(client)
    actions = np.array([[0.75, -0.25], [-1.0, 0.5]], np.float32)
    expected = lockstep_rows(url, actions)
    # env 1's action first: each row goes to its env id, as lists and as float64 too
    assert async_rows(url, actions[[1, 0]], [1, 0]) == expected
    assert async_rows(url, actions.astype(np.float64).tolist(), [0, 1]) == expected


def test_send_takes_steps_values(servers: dict[str, str]) -> None:
    head = f"is not an action for {LOCK} ({N} env ids): "
    with api.connect(servers["lock"], timeout=20) as client:
        client.async_reset(1)
        while len(client.recv(N).env_ids) < N:
            pass
        floats = np.array([[0.5, 1.0, 2.0], [0.0, 0.0, 0.0]])
        refused(lambda: client.send(floats, [0, 1]), head, "would be truncated to the u8 action")
        negative = np.array([[-1, 0, 0], [0, 0, 0]])
        outside = "a value is outside 0..255: it does not fit the u8 action field"
        refused(lambda: client.send(negative, [0, 1]), head, outside)
        refused(lambda: client.send(negative + 301, [0, 1]), head, outside)
        nothing_in_flight(client)
    actions = np.array([[2, 3, 4], [1, 0, 2]], np.int64)
    expected = lockstep_rows(servers["lock"], actions.astype(np.uint8))
    assert async_rows(servers["lock"], actions[[1, 0]], [1, 0]) == expected
    with api.connect(servers["echo"], timeout=20) as client:
        client.async_reset(1)
        while len(client.recv(N).env_ids) < N:
            pass
        space = describe_action_space(client.schema, client.spaces().act_n)
        head = f"is not an action for {space} ({N} env ids): "
        refused(lambda: client.send(np.array([1.7, 2.9]), [0, 1]), head, "would be truncated")
        refused(lambda: client.send([2**40, 1], [0, 1]), head, "does not fit the")
        refused(lambda: client.send(3, [0]), "(1 env id): pass one action per env id: an array")
        nothing_in_flight(client)
        client.send(np.array([7, 9]), np.array([1, 0]))  # env 1 gets 7, env 0 gets 9
        got = client.recv(N)
        observed = dict(
            zip(got.env_ids.tolist(), got.results.observation[:, 0].tolist(), strict=True)
        )
        assert observed == {1: 7.0, 0: 9.0}


class EchoEnv(gymnasium.Env[np.ndarray, Any]):
    """Observes the action it was given (as float32): what the env received, exactly."""

    def __init__(self, action_space: spaces.Space[Any], size: int) -> None:
        self.observation_space = spaces.Box(-1e9, 1e9, (size,), np.float32)
        self.action_space = action_space

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        assert self.action_space.contains(action), f"{action!r} not in {self.action_space}"
        observation = np.asarray(action, np.float32).reshape(self.observation_space.shape)
        return observation, 0.0, False, False, {}


class IntBoxEcho(EchoEnv):
    def __init__(self) -> None:
        super().__init__(spaces.Box(-5, 5, (2,), np.int16), 2)


class DiscreteEcho(EchoEnv):
    def __init__(self) -> None:
        super().__init__(spaces.Discrete(3), 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_send_delivers_exact_values_of_gymnasium_spaces(backend: str) -> None:
    with (
        gym_server(IntBoxEcho, unique_url(backend), num_envs=N).start() as server,
        api.connect(server.bound_url, timeout=20, autoreset="next_step") as client,
    ):
        client.async_reset(0)
        client.recv(N)
        head = f"is not an action for Box(-5, 5, (2,), int16) ({N} env ids): "
        floats = np.array([[1.9, -2.7], [70000.0, 3.0]])  # truncated to [1, -2], [70000, 3]
        refused(lambda: client.send(floats, [0, 1]), head, "would be truncated")
        refused(lambda: client.send(np.array([1, 2], np.int16), [0, 1]), head, "shape (2, 2)")
        nothing_in_flight(client)
        client.send(np.array([[1, -2], [5, -5]]), [1, 0])
        got = client.recv(N)
        observed = dict(zip(got.env_ids.tolist(), got.results.observation.tolist(), strict=True))
        assert observed == {1: [1.0, -2.0], 0: [5.0, -5.0]}
    with (
        gym_server(DiscreteEcho, unique_url(backend), num_envs=N).start() as server,
        api.connect(server.bound_url, timeout=20, autoreset="next_step") as client,
    ):
        client.async_reset(0)
        client.recv(N)
        head = f"is not an action for Discrete(3) ({N} env ids): "
        # -1 wrapped to 255 (the server's INVALID_ACTION named 255); 1.7 reached the env as 1
        text = refused(lambda: client.send(np.array([-1, 2]), [0, 1]), head)
        assert text.endswith("a value is outside 0..2 (and does not fit the u8 action field)")
        refused(lambda: client.send(np.array([1.7, 2.9]), [0, 1]), head, "would be truncated")
        nothing_in_flight(client)
        client.send([2, 1], [0, 1])
        got = client.recv(N)
        observed = dict(
            zip(got.env_ids.tolist(), got.results.observation[:, 0].tolist(), strict=True)
        )
        assert observed == {0: 2.0, 1: 1.0}


@pytest.mark.parametrize("lang", ["python", "node"])
def test_shm_send_before_any_reset_is_refused_at_send(lang: str) -> None:
    require_lang(lang)
    texts = []
    for backend in ("unix", "shm"):
        with (
            ServerProcess(unique_url(backend), env="echo", lang=lang, num_envs=N) as server,
            api.connect(server.url, timeout=20) as client,
        ):
            with pytest.raises(RemoteError) as info:
                client.send([0, 0], [0, 1])  # over shm: accepted, NOT_RESET came at recv
            assert info.value.code == ErrorCode.NOT_RESET, f"{backend}: {info.value}"
            texts.append(info.value.text)
            nothing_in_flight(client)
            client.async_reset(3)
            while len(client.recv(N).env_ids) < N:
                pass
            client.send([5, 6], [0, 1])
            got = client.recv(N)
            observed = dict(
                zip(got.env_ids.tolist(), got.results.observation[:, 0].tolist(), strict=True)
            )
            assert observed == {0: 5.0, 1: 6.0}
    assert texts == ["env 0: step before the first reset"] * 2


def test_action_errors_name_the_discrete_range() -> None:
    with gym_server("CartPole-v1", unique_url("unix")).start() as server:
        env = RemoteEnv(server.bound_url)
        try:
            env.reset(seed=0)
            with pytest.raises(ActionError) as info:
                env.step(-1)
            assert str(info.value) == (
                "step(): int -1 is not an action for Discrete(2) (1 env): -1 is outside 0..1 "
                "(and does not fit the u8 action field)"
            )
            with pytest.raises(RemoteError) as remote:  # in the u8 field: the server's check
                env.step(5)
            assert remote.value.code == ErrorCode.INVALID_ACTION
        finally:
            env.close()


def test_a_gymnasium_derived_action_space_is_named_as_the_user_wrote_it() -> None:
    observation = spaces.Box(-1.0, 1.0, (2,), np.float32)
    cases = [
        (spaces.Box(-5, 5, (2,), np.int16), "Box(-5, 5, (2,), int16)"),
        (spaces.Box(np.array([0, -3]), np.array([4, 3]), (2,), np.int32), "Box([0, -3], [4, 3]"),
        (spaces.Discrete(3, start=-1), "Discrete(3, start=-1)"),
        (spaces.MultiBinary(4), "MultiBinary(4)"),
        (spaces.MultiDiscrete([3, 4], start=[0, -1]), "MultiDiscrete([3, 4], start=[0, -1])"),
        (spaces.Box(-1.0, 1.0, (2,), np.float32), "Box(-1.0, 1.0, (2,), float32)"),
        (spaces.Discrete(5), "Discrete(5)"),
    ]
    for space, name in cases:
        schema = schema_of_spaces(observation, space)
        assert describe_action_space(schema, 5).startswith(name), (space, name)


def _padding(dtype: np.dtype) -> list[int]:
    """Byte offsets of a record dtype that no field covers."""
    covered = np.zeros(dtype.itemsize, dtype=bool)
    for _name, (field, offset, *_) in (dtype.fields or {}).items():
        covered[offset : offset + field.itemsize] = True
    return [i for i in range(dtype.itemsize) if not covered[i]]


@pytest.mark.parametrize("backend", ["unix", "zmq+ipc", "shm"])
def test_results_carry_zeros_in_their_padding(backend: str) -> None:
    """RECV_RESP from a Python server took its rows with records[ids], whose padding bytes NumPy
    leaves unset: bytes of the server's heap (pointer fragments) went over the wire, and the
    responses were not byte-identical to lock-step's. The client's copies (copy=True) had the
    same hole: NumPy's copy of records leaves their padding unset."""
    with ServerProcess(unique_url(backend), env="lock", num_envs=2) as server:
        with api.connect(server.url) as client:
            client.async_reset(5)
            client.recv(2)
            pad: list[int] = []
            for k in range(6):
                client.send(np.array([[2, 3, 4], [1, 0, 2]]), [0, 1])
                got = client.recv(2, copy=k % 2 == 1).results.record  # the wire's, then a copy
                pad = pad or _padding(got.dtype)
                assert pad, "the lock env's result record has padding"
                assert not got.view(np.uint8).reshape(2, -1)[:, pad].any()
                stepped = client.step(np.array([[2, 3, 4], [1, 0, 2]]), copy=True).record
                assert not stepped.view(np.uint8).reshape(2, -1)[:, pad].any()
