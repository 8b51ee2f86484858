"""A server started without ``schema=`` (issue 22 item 8), and the num_envs mismatch's advice.

``transport.Server(MyEnv, url)`` served pac_env whatever MyEnv returned, and every reset then
failed with "StepResult.observation: no value given". Now the schema is the one the env
declares (a ``SCHEMA`` attribute of the env, its class, factory or module, or a reference env's)
and, when it declares none, pac_env only once one env's reset result is checked to fit it; else
a ``TypeError`` at construction names what to pass. The client that asks an shm:// server for
another num_envs is told the two numbers and what to do, not "same transport version and schema".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport
from transport import api
from transport.envs.echo import EchoEnv
from transport.envs.rich_spaces import ReachEnv
from transport.errors import RegionMismatchError
from transport.generated import dictbox
from transport.runtime.env import Spaces

from .servers import unique_unix_url, unique_url


class ReachLike:
    """A user env (not a reference one) whose results follow dictbox; it declares nothing."""

    def __init__(self) -> None:
        self.inner = ReachEnv()

    def spaces(self) -> Spaces:
        return self.inner.spaces()

    def reset(self, seed: int | None = None) -> Any:
        return self.inner.reset(seed)

    def step(self, action: Any) -> Any:
        return self.inner.step(action)


class DeclaredReach(ReachLike):
    SCHEMA = dictbox.SCHEMA


def make_declared() -> ReachLike:
    return ReachLike()


make_declared.SCHEMA = dictbox.SCHEMA  # type: ignore[attr-defined]


def test_an_env_whose_results_do_not_fit_pac_env_is_refused_at_construction() -> None:
    url = unique_unix_url()
    with pytest.raises(TypeError) as info:
        transport.Server(ReachLike, url)
    text = str(info.value)
    assert text.startswith(f"Server(ReachLike, {url!r}): no schema= was given and ReachLike ")
    assert "StepResult.observation: no value given" in text  # why pac_env does not fit
    assert "Pass schema=" in text and "SCHEMA attribute" in text  # what to do
    assert not Path(url.removeprefix("unix://")).exists()  # nothing was bound


@pytest.mark.parametrize(
    "env",
    [ReachEnv, DeclaredReach, make_declared, DeclaredReach()],
    ids=["reference", "class", "factory", "instance"],
)
def test_a_declared_schema_is_served(env: Any) -> None:
    with transport.Server(env, unique_unix_url()).start() as server:
        assert server.schema.fingerprint == dictbox.SCHEMA.fingerprint
        with transport.connect(server.bound_url, timeout=10) as client:
            assert client.schema.name == "dictbox"
            first = client.reset(3)
            assert first.grid.shape == (2, 5, 5)
            client.step(np.array([0.5, -0.5], np.float32))


def test_an_undeclared_env_whose_results_fit_pac_env_is_served_as_before() -> None:
    class Plain(EchoEnv):  # a subclass of a reference env: its schema
        pass

    class Undeclared:
        def __init__(self) -> None:
            self.inner = EchoEnv()

        def spaces(self) -> Spaces:
            return self.inner.spaces()

        def reset(self, seed: int | None = None) -> Any:
            return self.inner.reset(seed)

        def step(self, action: int) -> Any:
            return self.inner.step(action)

    for env in (Plain, Undeclared):
        with transport.Server(env, unique_unix_url()).start() as server:
            assert server.schema.name == "pac_env"
            with transport.connect(server.bound_url, timeout=10) as client:
                client.reset(1)
                assert client.step(5).observation[0] == 5
    assert api.declared_schema(Plain) is not None and api.declared_schema(Undeclared) is None


def test_a_num_envs_mismatch_names_both_counts_and_the_fix() -> None:
    url = unique_url("shm")
    with transport.Server(EchoEnv, f"{url}?num_envs=2").start():
        with pytest.raises(RegionMismatchError) as info:
            transport.connect(f"{url}?num_envs=3", timeout=5)
    text = str(info.value)
    assert "control block field num_envs: expected 3, found 2" in text
    assert (
        "the client asked for 3 envs (?num_envs=3 in its URL) and the server serves 2: connect "
        "without ?num_envs= to take the server's count, or start the server with num_envs=3"
    ) in text
    assert "same transport version" not in text
