"""Auto-reset modes negotiated in HELLO: disabled, next-step (gymnasium), same-step (SB3)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport.errors import RemoteError
from transport.protocol import AutoReset, ErrorCode

from .servers import LANGS, ServerProcess, unique_unix_url

NUM_ENVS = 4


@pytest.fixture(scope="module", params=LANGS)
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    with ServerProcess(unique_unix_url(), env="pac", lang=request.param, num_envs=NUM_ENVS) as s:
        yield s.url


def legal(result: object, rng: random.Random) -> list[int]:
    masks = result.action_mask  # type: ignore[attr-defined]
    return [rng.choice(np.flatnonzero(masks[i]).tolist()) for i in range(NUM_ENVS)]


def test_disabled_refuses_a_step_after_done(url: str) -> None:
    with api.connect(url, timeout=10) as client:
        assert client.autoreset == AutoReset.DISABLED
        result, rng = client.reset(seed=3), random.Random(3)
        with pytest.raises(RemoteError) as info:
            for _ in range(1000):
                result = client.step(legal(result, rng))
        assert info.value.code == ErrorCode.NOT_RESET


def test_next_step_resets_on_the_following_step(url: str) -> None:
    with api.connect(url, timeout=10, autoreset="next_step") as client:
        assert client.server_info["autoreset"] == "next_step"
        result, rng = client.reset(seed=5), random.Random(5)
        ended = 0
        for _ in range(600):
            was_done = result.done.copy()
            result = client.step(legal(result, rng))
            for i in np.flatnonzero(was_done):
                ended += 1
                assert result.done[i] == 0 and result.reward[i] == 0.0  # the reset result
        assert ended >= NUM_ENVS


def test_same_step_returns_the_reset_and_the_final_result(url: str) -> None:
    with api.connect(url, timeout=10, autoreset="same_step") as client:
        result, rng = client.reset(seed=7), random.Random(7)
        ended = 0
        for _ in range(600):
            result = client.step(legal(result, rng))
            for index, final in client.finals:
                ended += 1
                assert final.done == 1
                assert result.done[index] == 0  # already reset: a fresh episode
                assert not np.shares_memory(final.observation, result.observation)
            assert not result.done.any()
        assert ended >= NUM_ENVS
