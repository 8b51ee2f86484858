"""What an exploratory tester serving third-party gymnasium envs found (2026-11-28), each fixed:

1. A Dict observation with a non-str key is refused naming the key (was: "does not rebuild
   them (a bug of transport.gym_schema)").
2. A reply over the client's ``max_body`` (render frames of many envs) is ``ReplyTooLargeError``
   with both sizes and how to raise the limit, the reply dropped and the connection kept over
   unix and zmq (was: the version/schema hint and a dead connection over unix, a bare
   "closed" over zmq); an adapter with a render mode accepts up to ``RENDER_MAX_BODY``.
3. A non-finite action in an unbounded Box is "not finite", not "not inside -inf..inf"; an
   out-of-bounds Box action stays refused, and ``ClipAction`` (documented) is the way out.
4. A factory's envs must have the spaces of its first (in process and in worker processes).
5. ``--gym-kwargs`` without ``--gym`` says nothing of a schema file's [env] shm.
6. An unsupported action space lists only what an action may be.
8. ``render()`` of envs made with render mode "ansi" says the mode must be 'rgb_array'.
9. ``gym_kwargs`` a factory does not take: an ``AdapterError`` naming the factory and them.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import transport
from transport.errors import (
    AdapterError,
    RemoteError,
    ReplyTooLargeError,
    SchemaError,
    TransportTimeoutError,
)
from transport.gym import RENDER_MAX_BODY, RemoteVectorEnv
from transport.gym_schema import schema_of_spaces
from transport.gym_serve import gym_schema, gym_server
from transport.protocol import DEFAULT_MAX_BODY
from transport.runtime.core import ActionRule

from .servers import ROOT, unique_url

SOCKETS = ["unix", "zmq+ipc"]
"""The socket backends whose clients this suite fixed (HTTP's client is another module's)."""


def _cleanup(url: str) -> None:
    for prefix in ("unix://", "zmq+ipc://"):
        if url.startswith(prefix):
            Path(url.removeprefix(prefix)).unlink(missing_ok=True)


# -- 1. Dict keys ---------------------------------------------------------------------------------


def test_a_dict_with_int_keys_is_refused_naming_the_key() -> None:
    observation = spaces.Dict({1: spaces.Discrete(2), 0: spaces.Box(0, 1, (2,))})
    with pytest.raises(SchemaError) as caught:
        schema_of_spaces(observation, spaces.Discrete(2))
    text = str(caught.value)
    assert "a bug of" not in text  # before: the self-check's "does not rebuild them"
    assert "its key 0 is not a str (int): Dict keys must be strings" in text, text
    assert text.startswith("observation_space: Dict space"), text
    nested = spaces.Dict({"a": spaces.Dict({(1, 2): spaces.Discrete(2)})})
    with pytest.raises(SchemaError, match=r"observation_space\['a'\].*key \(1, 2\) is not a str"):
        schema_of_spaces(nested, spaces.Discrete(2))


# -- 2. replies over max_body ---------------------------------------------------------------------


class FrameEnv(gymnasium.Env[np.ndarray, np.int64]):
    """Renders an all-zero frame of ``shape`` (cheap, any size), after ``delay`` seconds."""

    metadata = {"render_modes": ["rgb_array", "ansi"]}

    def __init__(
        self, shape: tuple[int, ...] = (256, 256, 3), delay: float = 0.0, render_mode: Any = None
    ) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.render_mode = render_mode
        self.shape, self.delay = shape, delay

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.full(2, 0.5, np.float32), 1.0, False, False, {}

    def render(self) -> Any:
        time.sleep(self.delay)
        return "ansi" if self.render_mode == "ansi" else np.zeros(self.shape, np.uint8)


def frames() -> FrameEnv:
    return FrameEnv(render_mode="rgb_array")


def slow_frames() -> FrameEnv:
    return FrameEnv(delay=2.0, render_mode="rgb_array")


def huge_frame() -> FrameEnv:
    return FrameEnv(shape=(4096, 5500, 3), render_mode="rgb_array")  # 67.6 MB > 64 MiB


SMALL = 64 << 10  # two 196 kB frames are over it; steps and the handshake are not


def _assert_too_large(exc: ReplyTooLargeError, url: str) -> None:
    text = str(exc)
    assert text.startswith(f"{url}: the server's reply is "), text
    assert f"bytes, over this client's max_body of {SMALL} bytes" in text, text
    assert "transport.connect(url, max_body=...)" in text and "max_body=...)" in text, text
    assert "disagree" not in text  # before: the version/schema hint
    assert exc.max_body == SMALL and exc.body_len > 2 * 256 * 256 * 3


@pytest.mark.parametrize("backend", SOCKETS)
def test_a_reply_over_max_body_says_so_and_the_connection_goes_on(backend: str) -> None:
    url = unique_url(backend)
    try:
        with gym_server(frames, url, num_envs=2).start() as server:
            with transport.connect(server.bound_url, max_body=SMALL) as client:
                client.reset(seed=0)
                for _ in range(2):
                    with pytest.raises(ReplyTooLargeError) as caught:
                        client.observe()  # every env's info: the frames
                    _assert_too_large(caught.value, server.bound_url)
                    # before: unix read the dropped body as the next header, zmq's connection
                    # was gone; now the reply was dropped and the next call is answered
                    view = client.step(np.zeros(2, np.int64))
                    assert np.asarray(view["reward"]).tolist() == [1.0, 1.0]
            envs = RemoteVectorEnv(server.bound_url, render_mode="rgb_array", max_body=SMALL)
            try:
                envs.reset(seed=0)
                with pytest.raises(ReplyTooLargeError):
                    envs.render()
                envs.step(np.zeros(2, np.int64))
            finally:
                envs.close()
            envs = RemoteVectorEnv(server.bound_url, render_mode="rgb_array")  # 1 GiB
            try:
                envs.reset(seed=0)
                rendered = envs.render()
                assert rendered is not None and rendered[1].shape == (256, 256, 3)
            finally:
                envs.close()
    finally:
        _cleanup(url)


@pytest.mark.parametrize("backend", SOCKETS)
def test_a_late_reply_over_max_body_is_dropped_before_the_next_one(backend: str) -> None:
    """An OBSERVE that timed out and whose late reply is over max_body: the next request's
    reply is read past it (the stream's late-reply rule), not refused for it."""
    url = unique_url(backend)
    try:
        with gym_server(slow_frames, url, num_envs=2).start() as server:
            with transport.connect(server.bound_url, max_body=SMALL, timeout=1.0) as client:
                client.reset(seed=0)
                with pytest.raises(TransportTimeoutError):
                    client.observe()  # the envs render for 2 s each
                time.sleep(4.5)  # the late, too large reply is in the socket now
                client.timeout = 30.0
                view = client.step(np.zeros(2, np.int64))
                assert np.asarray(view["reward"]).tolist() == [1.0, 1.0]
    finally:
        _cleanup(url)


@pytest.mark.parametrize("backend", SOCKETS)
def test_render_of_a_frame_over_64_mib_works_by_default(backend: str) -> None:
    """One env's 67.6 MB frame: an adapter with a render mode accepts it (before: unix's
    BadFrameError, zmq's dead connection), and stepping goes on."""
    assert RENDER_MAX_BODY > 4096 * 5500 * 3 > DEFAULT_MAX_BODY
    url = unique_url(backend)
    try:
        with gym_server(huge_frame, url, num_envs=1).start() as server:
            envs = RemoteVectorEnv(server.bound_url, render_mode="rgb_array")
            try:
                envs.reset(seed=0)
                rendered = envs.render()
                assert rendered is not None and rendered[0].shape == (4096, 5500, 3)
                envs.step(np.zeros(1, np.int64))
            finally:
                envs.close()
    finally:
        _cleanup(url)


def test_max_body_with_a_client_is_refused() -> None:
    url = unique_url("unix")
    try:
        with gym_server(frames, url, num_envs=1).start() as server:
            client = transport.connect(server.bound_url, autoreset="next_step")
            try:
                with pytest.raises(AdapterError, match=r"connect the client with it instead"):
                    RemoteVectorEnv(client=client, max_body=SMALL)
            finally:
                client.close()
    finally:
        _cleanup(url)


# -- 3. Box actions -------------------------------------------------------------------------------


class UnboundedAction(gymnasium.Env[np.ndarray, np.ndarray]):
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(2, np.float32), float(np.sum(action)), False, False, {}


def clipped_pendulum() -> Any:
    return gymnasium.wrappers.ClipAction(gymnasium.make("Pendulum-v1"))


def _invalid_action(url: str, action: Any) -> str:
    envs = RemoteVectorEnv(url)
    try:
        envs.reset(seed=0)
        with pytest.raises(RemoteError) as caught:
            envs.step(np.asarray([action], np.float32))
        assert caught.value.name == "INVALID_ACTION"
        return caught.value.text
    finally:
        envs.close()


def test_action_texts_say_not_finite_or_not_inside() -> None:
    url = unique_url("unix")
    try:
        with gym_server(UnboundedAction, url, num_envs=1).start() as server:
            text = _invalid_action(server.bound_url, [np.inf, 0.5])
            assert text == "env 0: action [Infinity, 0.5] is not finite", text
            text = _invalid_action(server.bound_url, [np.nan, 0.5])
            assert text == "env 0: action [NaN, 0.5] is not finite", text
        with gym_server("Pendulum-v1", url, num_envs=1).start() as server:
            text = _invalid_action(server.bound_url, [5.0])
            assert text == "env 0: action [5] is not inside [-2]..[2] and finite", text
        with gym_server(clipped_pendulum, url, num_envs=1).start() as server:
            envs = RemoteVectorEnv(server.bound_url)  # docs/gym.md's way out: the env clips
            try:
                envs.reset(seed=0)
                envs.step(np.asarray([[5.0]], np.float32))
            finally:
                envs.close()
    finally:
        _cleanup(url)


@pytest.mark.parametrize(
    ("low", "high", "action", "text"),
    [
        (None, None, [np.inf, 0.5], "action [Infinity, 0.5] is not finite"),
        (None, 2.0, [-np.inf, 0.0], "action [-Infinity, 0] is not finite"),
        (None, 2.0, [5.0, 0.0], "action [5, 0] is not inside -inf..[2, 2] and finite"),
        (-1.0, 1.0, [np.nan, 0.0], "action [NaN, 0] is not inside [-1, -1]..[1, 1] and finite"),
        (
            -1.0,
            1.0,
            [np.inf, 0.0],
            "action [Infinity, 0] is not inside [-1, -1]..[1, 1] and finite",
        ),
    ],
)
def test_the_rule_names_what_fails(low: Any, high: Any, action: Any, text: str) -> None:
    """The texts node_bridge/src/test/action_texts.test.ts pins for Node."""
    bounds = "" if low is None else f", low = {low}"
    bounds += "" if high is None else f", high = {high}"
    schema = transport.load_schema(_write_schema(bounds))
    rule = ActionRule(schema.ir.structs["StepRequest"].role("action"))
    assert rule.describe(np.asarray(action), 0) == text


def _write_schema(bounds: str) -> Path:
    import tempfile

    text = f"""
[schema]
name = "t"
version = 1
[env]
[structs.StepResult]
fields = [
  {{ name = "o", type = "f32[2]", role = "observation" }},
  {{ name = "reward", type = "f64", role = "reward" }},
  {{ name = "terminated", type = "bool", role = "terminated" }},
]
[structs.StepRequest]
fields = [{{ name = "act", type = "f32[2]", role = "action"{bounds} }}]
"""
    path = Path(tempfile.mkdtemp()) / "t.toml"
    path.write_text(text)
    return path


# -- 4. a factory's envs keep the first env's spaces ----------------------------------------------


class Sized(gymnasium.Env[np.ndarray, np.int64]):
    def __init__(self, k: int, n: int = 3) -> None:
        self.observation_space = spaces.Box(-k, k, (n,), np.float32)
        self.action_space = spaces.Discrete(k + 1)
        self.n = n

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        return np.zeros(self.n, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(self.n, np.float32), 0.0, False, False, {}


PARENT = "TRANSPORT_TEST_FACTORY_PARENT"


def other_in_workers() -> Sized:
    """Box(-1, 1, (3,)) / Discrete(2) in the test's process, Box(-2, 2, (4,)) / Discrete(3) in
    any other (the server's worker processes)."""
    return Sized(1) if os.getpid() == int(os.environ[PARENT]) else Sized(2, 4)


def _both_spaces(text: str) -> None:
    assert "made an env whose spaces differ from those of its first env" in text, text
    assert "observation_space Box(-2.0, 2.0, (" in text, text
    assert "(the first env's: Box(-1.0, 1.0, (3,), float32))" in text, text
    assert "action_space Discrete(3) (the first env's: Discrete(2))" in text, text


def test_a_factory_whose_later_envs_differ_is_refused_in_process() -> None:
    made = itertools.count()
    url = unique_url("unix")
    try:
        with pytest.raises(ValueError) as caught:  # the server's own check makes a second env
            gym_server(lambda: Sized(1 if next(made) == 0 else 2), url, num_envs=2)
        _both_spaces(str(caught.value))
    finally:
        _cleanup(url)


def test_a_factory_whose_envs_differ_in_worker_processes_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PARENT, str(os.getpid()))
    url = unique_url("unix")
    try:
        with gym_server(other_in_workers, url, num_envs=2, workers=2).start() as server:
            with pytest.raises(RemoteError) as caught:  # before: served, then AssertionError
                RemoteVectorEnv(server.bound_url)
            _both_spaces(str(caught.value))
            assert "(3,)" not in str(caught.value).split("the first env's")[0]
    finally:
        _cleanup(url)


# -- 5. the CLI's --gym-kwargs without --gym ------------------------------------------------------


def test_gym_kwargs_without_gym_says_only_what_it_needs(tmp_path: Path) -> None:
    for args, said, unsaid in (
        (["--gym-kwargs", "{}"], "--gym-kwargs needs --gym ENV_ID", "[env] shm"),
        (["--shm-layout", "columns"], "--shm-layout needs --gym ENV_ID", "gymnasium.make"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "transport.tools.serve_cli", f"unix://{tmp_path}/s", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert unsaid not in done.stderr, done.stderr
    assert "(a schema file says its layout with [env] shm)" in done.stderr


# -- 6. an action space that cannot be carried ----------------------------------------------------


@pytest.mark.parametrize(
    "action", [spaces.Text(5), spaces.Tuple([spaces.Discrete(2)])], ids=["text", "tuple"]
)
def test_an_unsupported_action_lists_what_an_action_may_be(action: Any) -> None:
    with pytest.raises(SchemaError) as caught:
        schema_of_spaces(spaces.Discrete(2), action)
    text = str(caught.value)
    assert "an action may be Box, Discrete, MultiDiscrete or MultiBinary" in text, text
    assert "Dict / Tuple of these" not in text


# -- 8. render modes other than rgb_array ---------------------------------------------------------


def test_render_of_ansi_envs_says_the_mode_must_be_rgb_array() -> None:
    url = unique_url("unix")
    try:
        kwargs = {"render_mode": "ansi"}
        with gym_server("FrozenLake-v1", url, num_envs=1, gym_kwargs=kwargs).start() as server:
            envs = RemoteVectorEnv(server.bound_url, render_mode="rgb_array")
            try:
                envs.reset(seed=0)
                with pytest.raises(AdapterError) as caught:
                    envs.render()
            finally:
                envs.close()
        text = str(caught.value)
        assert "only when made with render_mode 'rgb_array'" in text, text
        assert "'ansi'" in text and "only when made with a render mode" not in text
    finally:
        _cleanup(url)


# -- 9. gym_kwargs a factory does not take --------------------------------------------------------


def no_kwargs() -> FrameEnv:
    return FrameEnv()


def sized(k: int = 1) -> Sized:
    return Sized(k)


def test_gym_kwargs_a_factory_does_not_take_are_an_adapter_error() -> None:
    url = unique_url("unix")
    try:
        for make in (
            lambda: gym_server(no_kwargs, url, gym_kwargs={"foo": 1}),
            lambda: gym_schema(no_kwargs, {"foo": 1}),
        ):
            with pytest.raises(AdapterError) as caught:  # before: a bare TypeError
                make()
            text = str(caught.value)
            assert text.startswith("no_kwargs(**{'foo': 1}) cannot be called: "), text
            assert "got an unexpected keyword argument 'foo'" in text, text
            assert "give it parameters of those names, or drop gym_kwargs" in text
        with gym_server(sized, url, num_envs=1, gym_kwargs={"k": 2}).start() as server:
            envs = RemoteVectorEnv(server.bound_url)
            try:
                assert envs.single_action_space == spaces.Discrete(3)
            finally:
                envs.close()
    finally:
        _cleanup(url)
