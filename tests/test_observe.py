"""OBSERVE (Appendix A 0x07/0x08): every env's current result without a step, and its info map.

Served by the env runtime over every stream backend (a Python server in process); envs without
``observe()`` answer their last result unchanged, envs without ``info()`` an empty map.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport.errors import RemoteError
from transport.generated import pac_env
from transport.protocol import ErrorCode
from transport.runtime.env import Spaces

from .servers import unique_url

BACKENDS = ["unix", "http", "zmq+ipc", "zmq+tcp"]


class Counter:
    """observation[0] counts steps; observe() shows observation[1] = 99; info() the count."""

    def __init__(self) -> None:
        self.count = 0

    def spaces(self) -> Spaces:
        return Spaces(612, 92)

    def _result(self) -> np.ndarray:
        record = pac_env.StepResult.zeros()
        record["action_mask"] = 1
        record["observation"][0] = self.count
        return record

    def reset(self, seed: int | None = None) -> np.ndarray:
        self.count = 0
        return self._result()

    def step(self, action: int) -> np.ndarray:
        self.count += 1
        return self._result()

    def observe(self) -> np.ndarray:
        record = self._result()
        record["observation"][1] = 99
        return record

    def info(self) -> dict[str, Any]:
        return {"count": self.count, "name": "counter"}


class Plain(Counter):
    """No observe() and no info(): OBSERVE answers the last result and {}."""

    observe = None  # type: ignore[assignment]
    info = None  # type: ignore[assignment]


@pytest.mark.parametrize("backend", BACKENDS)
def test_observe_answers_results_and_info_without_stepping(backend: str) -> None:
    with (
        api.Server(Counter, unique_url(backend), num_envs=3).start() as server,
        api.connect(server.bound_url, timeout=5) as client,
    ):
        client.reset()
        client.step([1, 2, 3])
        client.step([1, 2, 3])
        result, infos = client.observe()
        assert result.observation.shape == (3, 612)
        np.testing.assert_array_equal(result.observation[:, 0], [2, 2, 2])
        np.testing.assert_array_equal(result.observation[:, 1], [99, 99, 99])
        assert infos == [{"count": 2, "name": "counter"}] * 3
        again, _ = client.observe()  # no step happened
        np.testing.assert_array_equal(again.observation[:, 0], [2, 2, 2])
        assert client.step([1, 1, 1]).observation[0, 0] == 3


def test_observe_without_observe_or_info_is_the_last_result() -> None:
    with (
        api.Server(Plain, unique_url("unix")).start() as server,
        api.connect(server.bound_url, timeout=5) as client,
    ):
        client.reset()
        client.step(4)
        client.health()  # other responses do not disturb the kept result
        client.spaces()
        result, infos = client.observe()
        assert result.observation[0] == 1 and result.observation[1] == 0
        assert infos == [{}]


def test_observe_before_reset_is_not_reset() -> None:
    with (
        api.Server(Counter, unique_url("unix"), num_envs=2).start() as server,
        api.connect(server.bound_url, timeout=5) as client,
    ):
        with pytest.raises(RemoteError) as info:
            client.observe()
        assert info.value.code == ErrorCode.NOT_RESET and "env 0" in info.value.text
        client.reset()
        client.observe()


def test_observe_with_envs_in_worker_processes() -> None:
    """The pool runner answers OBSERVE too: results rewritten in the workers, info maps back."""
    with (
        api.Server(Counter, unique_url("unix"), num_envs=3, workers=2).start() as server,
        api.connect(server.bound_url, timeout=30) as client,
    ):
        client.reset()
        client.step([0, 1, 2])
        result, infos = client.observe()
        np.testing.assert_array_equal(result.observation[:, 1], [99, 99, 99])
        assert infos == [{"count": 1, "name": "counter"}] * 3
