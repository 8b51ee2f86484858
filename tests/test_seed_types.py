"""What a reset's ``seed`` may be: None, an int, or one int or None per env.

A str was read as a list of seeds (``reset(seed="12")`` on 2 envs was ``reset(seed=[1, 2])``;
on 1 env ``"7"`` was 7), floats in a list were truncated (``[1.7, 2.9]`` was ``[1, 2]``) and
a float seed said "'float' object is not iterable". Each is now a ``TypeError`` naming the seed
before any bytes move; a good seed still works. The lock-step client, async_reset and the
multi-server client; real unix servers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import transport
from transport.envs.echo import EchoEnv
from transport.multi import connect_many

from .servers import unique_unix_url

NUM_ENVS = 2


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = transport.Server(EchoEnv, unique_unix_url(), num_envs=NUM_ENVS).start()
    try:
        yield server.bound_url
    finally:
        server.close()


BAD_SEEDS: list[tuple[Any, str]] = [
    ("12", "not str"),
    (b"12", "not bytes"),
    (3.0, "not float"),
    (np.float32(3), "not float32"),
    (True, "not bool"),
    ([1.7, 2.9], "env 0's seed is 1.7, not an int or None"),
    ([1, "2"], "env 1's seed is '2', not an int or None"),
    ([1, True], "env 1's seed is True"),
    ({1: 2}, "not dict"),
]


@pytest.mark.parametrize(("seed", "said"), BAD_SEEDS, ids=[repr(s) for s, _ in BAD_SEEDS])
def test_a_seed_of_another_type_is_a_type_error(url: str, seed: Any, said: str) -> None:
    with transport.connect(url, timeout=10) as client:
        with pytest.raises(TypeError, match="seed") as caught:
            client.reset(seed=seed)
        assert said in str(caught.value), caught.value
        client.reset(seed=5)  # the client is still usable
        assert client.step([1, 2])["observation"][1, 0] == 2


def test_seeds_out_of_range_or_of_the_wrong_count_are_value_errors(url: str) -> None:
    with transport.connect(url, timeout=10) as client:
        for seed in (-1, 1 << 64, [1, -1]):
            with pytest.raises(ValueError, match=r"0\.\.2\*\*64-1"):
                client.reset(seed=seed)
        with pytest.raises(ValueError, match=r"one seed .* per env: 2, got 3"):
            client.reset(seed=[1, 2, 3])


def test_good_seeds_still_work(url: str) -> None:
    with transport.connect(url, timeout=10) as client:
        good: list[Any] = [7, np.int64(7), np.uint64(7), [7, None], (7, 8), np.array([7, 8])]
        for seed in good:
            client.reset(seed=seed)


def test_async_reset_takes_one_int_seed(url: str) -> None:
    with transport.connect(url, timeout=10) as client:
        bad: list[Any] = ["12", 3.0, [1, 2]]
        for seed in bad:
            with pytest.raises(TypeError, match=r"async_reset.*a seed is one int"):
                client.async_reset(seed)
        client.async_reset(4)
        assert len(client.recv(NUM_ENVS).env_ids) == NUM_ENVS


def test_the_multi_server_client_checks_seeds_as_one_client(url: str) -> None:
    with connect_many([url, url], timeout=10) as multi:
        with pytest.raises(TypeError, match="not str"):
            multi.reset(seed="1234")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"env 2.s seed is 1\.5"):
            multi.reset(seed=[1, 2, 1.5, 3])  # type: ignore[list-item]
        multi.reset(seed=[1, 2, None, 3])
