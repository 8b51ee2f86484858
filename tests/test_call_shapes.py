"""One call, one answer, on every backend (issue 22 item 3).

The contract suite's ``call_shapes`` check runs the call-shape matrix on the contract env
(Discrete actions: pac_env, tetris, mahjong_env) over every scheme and both server languages;
here the same matrix (``transport.testing.checks_shapes``) runs on the reference Box env
(``reach``: ``move`` f32[2] in -1..1) and MultiDiscrete env (``lock``: ``dials`` u8[3]) in real
server processes, and the messages of the cases the issue names are pinned word for word.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import transport
from transport import ActionError
from transport.errors import TransportError
from transport.multi import connect_many
from transport.testing.checks_shapes import shape_matrix

from .servers import LANGS, ServerProcess, unique_url

SCHEMES = ["unix", "http", "zmq+ipc", "zmq+tcp", "shm"]
BOX = "Box(-1.0, 1.0, (2,), float32)"
LOCK = "MultiDiscrete([3, 4, 5])"
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def echo() -> Iterator[ServerProcess]:
    """A 1-env Python echo server (pac_env: one i32 action, Discrete(92)) on unix."""
    with ServerProcess(unique_url("unix"), env="echo") as server:
        yield server


@pytest.fixture(scope="module")
def reach() -> Iterator[ServerProcess]:
    """A 1-env Python reach server (dictbox: Box(-1.0, 1.0, (2,), float32)) on unix."""
    with ServerProcess(unique_url("unix"), env="reach") as server:
        yield server


# -- the matrix ------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_box_call_shapes_answer_alike_on_every_backend(scheme: str, lang: str) -> None:
    with (
        ServerProcess(unique_url(scheme), env="reach", lang=lang) as server,
        transport.connect(server.url, timeout=TIMEOUT) as client,
    ):
        assert shape_matrix(client, BOX) == []


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_box_call_shapes_of_a_two_env_server(scheme: str, lang: str) -> None:
    with (
        ServerProcess(unique_url(scheme), env="reach", lang=lang, num_envs=2) as server,
        transport.connect(server.url, timeout=TIMEOUT) as client,
    ):
        assert shape_matrix(client, BOX) == []


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_multidiscrete_call_shapes(scheme: str, lang: str) -> None:
    with (
        ServerProcess(unique_url(scheme), env="lock", lang=lang) as server,
        transport.connect(server.url, timeout=TIMEOUT) as client,
    ):
        assert shape_matrix(client, LOCK) == []


# -- the cases the issue names, word for word ------------------------------------------------


def test_an_int_is_never_broadcast_to_a_box(reach: ServerProcess) -> None:
    """step(1) on a Box env sent [1, 1]; now it is refused, naming the space and the fix."""
    with transport.connect(reach.url, timeout=TIMEOUT) as client:
        with pytest.raises(ActionError) as info:
            client.step(1)
        assert str(info.value) == (
            f"step(): int 1 is not an action for {BOX} (1 env): pass an array of shape (2,) "
            "(one action) or (1, 2) (a batch of one)"
        )
        client.reset(3)
        assert client.step(np.array([0.5, -0.5])).record.shape == ()  # the session goes on


def test_a_wrong_sized_box_action_names_the_space_not_numpy(reach: ServerProcess) -> None:
    """Was ``cannot reshape array of size 3 into shape (2,)``."""
    with transport.connect(reach.url, timeout=TIMEOUT) as client:
        with pytest.raises(ActionError) as info:
            client.step(np.zeros(3))
        assert str(info.value) == (
            f"step(): ndarray of shape (3,), dtype float64 is not an action for {BOX} (1 env): "
            "pass an array of shape (2,) (one action) or (1, 2) (a batch of one)"
        )


def test_a_float_for_a_discrete_action_is_refused(echo: ServerProcess) -> None:
    """Was ``TypeError: object of type 'float' has no len()``."""
    with transport.connect(echo.url, timeout=TIMEOUT) as client:
        with pytest.raises(ActionError) as info:
            client.step(0.5)
        assert str(info.value) == (
            "step(): float 0.5 is not an action for Discrete(92) (1 env): its float64 values "
            "would be truncated to the i32 action field; pass integers"
        )
        with pytest.raises(ActionError, match=r"int 4294967296 is not an action .*outside"):
            client.step(2**32)


def test_a_batch_of_one_is_a_batch_of_one(echo: ServerProcess) -> None:
    """``step(np.array([a]))`` on a 1-env server: a batch of one (the shm leg is in the
    matrix: it raised ``ProtocolError: expected msg_type 0x12, got 0x04``)."""
    with transport.connect(echo.url, timeout=TIMEOUT) as client:
        client.reset(1)
        batch = client.step(np.array([7]))
        assert batch.observation.shape == (1, 612) and batch.observation[0, 0] == 7
        one = client.step(7)
        assert one.observation.shape == (612,) and one.observation[0] == 7


def test_action_error_is_a_transport_error_and_a_value_error() -> None:
    assert issubclass(ActionError, TransportError) and issubclass(ActionError, ValueError)


def test_connect_many_takes_one_action_per_env_by_the_same_rule() -> None:
    with (
        ServerProcess(unique_url("unix"), env="echo") as first,
        ServerProcess(unique_url("unix"), env="echo", num_envs=2) as second,
        connect_many([first.url, second.url], timeout=TIMEOUT) as client,
    ):
        client.reset(1)
        assert client.step([1, 2, 3]).observation[:, 0].tolist() == [1, 2, 3]
        with pytest.raises(ActionError, match=r"^step\(\): int 1 is not an action for "):
            client.step(1)
        with pytest.raises(ActionError, match=r"would be truncated"):
            client.step(np.zeros(3))
        with pytest.raises(ActionError, match=r"pass one action per env: an array of shape \(3,\)"):
            client.step([1, 2])
