"""An env that raises: a typed error naming the env, that env reset, the others go on."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport.errors import REMOTE_TRACEBACK_MARKER, EnvError, RemoteError
from transport.protocol import ErrorCode, decode_error, encode_error
from transport.runtime.env import Spaces

from .servers import unique_url

POISON = 7  # the action that makes an env raise
OBS_N, ACT_N = 612, 92
created: list[int] = []
closed: list[FlakyEnv] = []


class FlakyEnv:
    """Counts its steps in observation[1]; raises on action POISON; its reset can be broken."""

    broken_resets = 0  # the next N resets (of any instance) raise

    def __init__(self) -> None:
        created.append(1)
        self.steps = 0

    def spaces(self) -> Spaces:
        return Spaces(OBS_N, ACT_N)

    def close(self) -> None:
        closed.append(self)

    def _result(self, action: int) -> dict[str, object]:
        obs = np.zeros(OBS_N, dtype=np.float32)
        obs[0], obs[1] = action, self.steps
        return {
            "observation": obs,
            "action_mask": np.ones(ACT_N, dtype=np.uint8),
            "reward": 0.0,
            "done": 0,
            "rank": 0,
            "life": 0,
            "money": 0,
            "stage": 0,
            "board_size": 0,
            "level": 0,
            "synergy_count": 0,
            "items_held": 0,
            "actions_this_turn": 0,
        }

    def reset(self, seed: int | None = None) -> dict[str, object]:
        if FlakyEnv.broken_resets > 0:
            FlakyEnv.broken_resets -= 1
            raise OSError("the simulator crashed during reset")
        self.steps = 0
        return self._result(0)

    def step(self, action: int) -> dict[str, object]:
        if action == POISON:
            raise ValueError("poisoned action")
        self.steps += 1
        return self._result(action)


@pytest.fixture(params=["unix", "http"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    FlakyEnv.broken_resets = 0
    closed.clear()
    with api.Server(FlakyEnv, unique_url(request.param), num_envs=4).start() as server:
        yield server.bound_url


def test_a_failed_reset_recreates_the_env(url: str) -> None:
    with api.connect(url) as client:
        client.reset()
        client.step([1, 1, 1, 1])
        before = len(created)
        FlakyEnv.broken_resets = 1  # env 1 raises, then its reset raises: recreated
        with pytest.raises(EnvError) as info:
            client.step([1, POISON, 1, 1])
        assert info.value.env_id == 1 and "recreated" in info.value.text
        assert len(created) == before + 1
        assert len(closed) == 1 and closed[0].steps == 1  # the broken env: closed when replaced
        result = client.step([2, 2, 2, 2])
        assert list(result.observation[:, 1]) == [3, 1, 3, 3]


def test_an_env_whose_reset_keeps_failing_needs_a_reset(url: str) -> None:
    with api.connect(url) as client:
        client.reset()
        FlakyEnv.broken_resets = 2  # its reset, then the recreated env's reset
        with pytest.raises(EnvError) as info:
            client.step([POISON, 1, 1, 1])
        assert len(closed) == 1  # one of the two broken envs is let go of, and closed
        assert info.value.env_id == 0 and "send a reset" in info.value.text
        with pytest.raises(RemoteError) as refused:
            client.step([1, 1, 1, 1])
        assert refused.value.code == ErrorCode.NOT_RESET
        client.reset()
        assert list(client.step([1, 1, 1, 1]).observation[:, 1]) == [1, 1, 1, 1]


def test_decode_error_parses_the_env_id() -> None:
    error = decode_error(encode_error(ErrorCode.ENV_ERROR, "env 12: boom"))
    assert isinstance(error, EnvError) and error.env_id == 12
    anonymous = decode_error(encode_error(ErrorCode.ENV_ERROR, "boom"))
    assert isinstance(anonymous, EnvError) and anonymous.env_id is None
    other = decode_error(encode_error(ErrorCode.MASKED_ACTION, "env 1: action 3 is masked out"))
    assert not isinstance(other, EnvError)


def test_decode_error_splits_the_remote_traceback() -> None:
    text = "env 2: ValueError: boom (the env was reset)"
    trace = '  File "env.py", line 9, in step\n    raise ValueError("boom")\nValueError: boom'
    error = decode_error(encode_error(ErrorCode.ENV_ERROR, text + REMOTE_TRACEBACK_MARKER + trace))
    assert isinstance(error, EnvError) and error.env_id == 2
    assert error.text == text and error.remote_traceback == trace
    assert str(error) == f"ENV_ERROR (10): {text}{REMOTE_TRACEBACK_MARKER}{trace}"
    plain = decode_error(encode_error(ErrorCode.ENV_ERROR, text))
    assert isinstance(plain, EnvError) and plain.remote_traceback == ""
    assert str(plain) == f"ENV_ERROR (10): {text}"


def test_the_carried_frames_are_the_envs_own(url: str) -> None:
    with api.connect(url) as client:
        client.reset()
        with pytest.raises(EnvError) as info:
            client.step([1, 1, POISON, 1])
    trace = info.value.remote_traceback
    assert "in step" in trace and trace.endswith("ValueError: poisoned action")
    assert "transport/runtime" not in trace  # the runtime's own frames are left out
