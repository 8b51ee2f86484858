"""A user's env that makes a mistake the server can name (Node: env_mistakes.test.ts).

An env method written ``async def`` returns a coroutine, which the runtime never awaits.

The client gets ENV_ERROR saying so and what to do (the text of Node's ``asyncMethodText``),
not the codec's "expected a mapping ... not coroutine" or a vector env's "returns None or a
mapping of columns"; the coroutine is closed, so Python does not warn that it was never
awaited; a server without a schema says so at start. In process and in worker processes
(one-env objects), real unix servers and clients. A ``spaces()`` that returns a dict or a
tuple is refused at start, saying what to return (it was an INTERNAL AttributeError at every
connection)."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import transport
from transport.envs.echo import EchoEnv
from transport.envs.vector_echo import VectorEchoEnv
from transport.errors import EnvError
from transport.generated import pac_env

AWAITED = "returned a coroutine (is the method async def?), not a result"


class AsyncStep(EchoEnv):
    """``step`` is ``async def`` (no ``step_into``: the runtime calls ``step``)."""

    step_into = None  # type: ignore[assignment]

    async def step(self, action: int) -> dict[str, Any]:  # type: ignore[override]
        return {}


class AsyncStepInto(EchoEnv):
    """``step_into`` is ``async def``."""

    async def step_into(self, action: int, out: np.ndarray) -> None:  # type: ignore[override]
        return None


class AsyncStepEnvs(VectorEchoEnv):
    """A vector env whose ``step_envs`` is ``async def``."""

    async def step_envs(  # type: ignore[override]
        self, actions: np.ndarray, ids: np.ndarray | None, out: np.ndarray
    ) -> None:
        return None


def make_async_step_envs() -> AsyncStepEnvs:
    return AsyncStepEnvs(3)


class AsyncReset:
    """No schema declared and an ``async def reset``: refused at start."""

    def spaces(self) -> transport.Spaces:
        return transport.Spaces(612, 92)

    async def reset(self, seed: int | None = None) -> dict[str, Any]:
        return {}

    def step(self, action: int) -> dict[str, Any]:
        return {}


@pytest.fixture
def unix_url() -> Iterator[str]:
    path = f"/tmp/async-env-{os.getpid()}-{uuid.uuid4().hex[:6]}.sock"
    yield f"unix://{path}"
    assert not os.path.exists(path), "the server removed its socket"


def _step_refused(url: str, served: Any, num_envs: int, workers: int) -> str:
    server = transport.Server(
        served, url, schema=pac_env.SCHEMA, num_envs=num_envs, workers=workers
    ).start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
            client = transport.connect(url, timeout=30)
            try:
                client.reset(1)
                with pytest.raises(EnvError) as caught:
                    client.step(list(range(1, num_envs + 1)))
                return str(caught.value)
            finally:
                client.close()
    finally:
        server.close()


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("env", [AsyncStep, AsyncStepInto], ids=["step", "step_into"])
def test_an_async_step_is_named(unix_url: str, env: type, workers: int) -> None:
    text = _step_refused(unix_url, env, 2, workers)
    for i in range(2):
        assert f"env {i}: {AWAITED}" in text, text
    assert "make it a plain method that returns the result" in text
    assert "not coroutine" not in text and "bad values" not in text


def test_an_async_step_envs_is_named(unix_url: str) -> None:
    text = _step_refused(unix_url, make_async_step_envs, 3, 0)
    assert f"env 0: {AWAITED}" in text, text
    assert "envs 1..2: the same error" in text, text  # one call failed them all
    assert "mapping of columns" not in text and "TypeError" not in text


def test_an_async_reset_without_a_schema_is_named_at_start(unix_url: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError) as caught:
            transport.Server(AsyncReset, unix_url)  # type: ignore[arg-type]
    text = str(caught.value)
    assert f"reset() {AWAITED}" in text, text
    assert "do not fit" not in text


class DictSpaces(EchoEnv):
    """``spaces()`` returns a dict, not a ``Spaces``."""

    def spaces(self) -> Any:
        return {"obs_n": 612, "act_n": 92}


class TupleSpaces(EchoEnv):
    def spaces(self) -> Any:
        return (612, 92)


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("env", [DictSpaces, TupleSpaces], ids=["dict", "tuple"])
def test_spaces_of_another_type_are_refused_at_start(
    unix_url: str, env: type, workers: int
) -> None:
    with pytest.raises(ValueError) as caught:
        transport.Server(env, unix_url, schema=pac_env.SCHEMA, num_envs=2, workers=workers)
    text = str(caught.value)
    assert f"{env.__name__}.spaces() returned" in text, text
    assert "not a transport.Spaces: return transport.Spaces(obs_n=..., act_n=...)" in text
    assert "AttributeError" not in text
