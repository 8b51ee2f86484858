"""connect_many over servers of different schemas: a typed error naming both, and no leak.

The servers that did connect are closed before the error leaves ``connect_many``: an shm://
region's client seat is free for the next ``connect`` at once, not when the garbage collector
gets to the exception's frames.
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator

import pytest

import transport
from transport.errors import FingerprintMismatchError
from transport.multi import BatchError

from .servers import ServerProcess


@pytest.fixture
def no_gc() -> Iterator[None]:
    """Leaked clients stay leaked (the collector does not rescue the test)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _shm() -> str:
    return f"shm://test-multi-fp-{uuid.uuid4().hex[:12]}"


def test_servers_of_different_schemas_are_refused_and_closed(no_gc: None) -> None:
    with (
        ServerProcess(_shm(), env="echo", num_envs=1) as a,
        ServerProcess(_shm(), env="mahjong", num_envs=1) as b,
    ):
        with pytest.raises(FingerprintMismatchError) as info:
            transport.connect_many([a.url, b.url], timeout=5)
        text = str(info.value)
        with transport.connect(a.url, timeout=5) as ca, transport.connect(b.url, timeout=5) as cb:
            for url, client in ((a.url, ca), (b.url, cb)):
                assert url in text and client.schema.name in text, text
                assert f"{client.schema.fingerprint:016x}" in text, text
            assert {info.value.local, info.value.remote} == {
                ca.schema.fingerprint,
                cb.schema.fingerprint,
            }
            ca.reset()  # the seats the failed batch held are usable at once
            cb.reset()


def test_a_failed_batch_closes_the_servers_that_connected(no_gc: None) -> None:
    """One server unreachable: BatchError, and the one that did connect is closed."""
    with ServerProcess(_shm(), env="echo", num_envs=1) as a:
        missing = _shm()
        with pytest.raises(BatchError) as info:
            transport.connect_many([a.url, missing], timeout=2)
        assert info.value.urls == [missing]
        with transport.connect(a.url, timeout=5) as client:
            client.reset()


def test_the_same_schema_still_forms_a_batch() -> None:
    with (
        ServerProcess(_shm(), env="echo", num_envs=1) as a,
        ServerProcess(_shm(), env="echo", num_envs=2) as b,
        transport.connect_many([a.url, b.url], timeout=5) as multi,
    ):
        assert multi.num_envs == 3
        multi.reset(seed=0)
