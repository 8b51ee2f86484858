"""Real frames over every backend (issue 23): ``render()`` of a served CartPole-v1 returns its
400x600x3 rgb_array frame over unix, zmq and shm; a Discrete env without an action mask gets
Discrete(n) over shm as over unix; frames too large for a slot's info area go through the
region's side segment (docs/shm.md "Frames") and the steps that do not render stay as fast.

The Node server cannot host a Python gymnasium env: it serves a JS env that paints a synthetic
210x160x3 frame (Atari's size), through the same side segment.
"""

from __future__ import annotations

import os
import statistics
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport.backends.shm.region import INFO_SIDE, SHM_DIR, SIDE_SUFFIX, list_segments
from transport.errors import AdapterError
from transport.runtime.env import Spaces

from .servers import ServerProcess, require_lang, unique_url

gymnasium = pytest.importorskip("gymnasium")
pytest.importorskip("pygame", reason="CartPole renders with pygame (pip install pygame)")
from transport.gym import RemoteEnv, RemoteVectorEnv  # noqa: E402

SCHEMA = textwrap.dedent(
    """
    [schema]
    name = "cartpole_frames"
    version = 1
    layout = "natural"

    [env]

    [structs.StepResult]
    fields = [
      { name = "observation", type = "f32[4]", role = "observation" },
      { name = "reward",      type = "f32",    role = "reward" },
      { name = "terminated",  type = "bool",   role = "terminated" },
      { name = "truncated",   type = "bool",   role = "truncated" },
    ]

    [structs.StepRequest]
    fields = [{ name = "action", type = "u8", role = "action" }]
    """
)

BACKENDS = ["unix", "zmq+ipc", "shm"]
SEED = 7
ACTIONS = [0, 1, 1, 0, 1, 0, 0, 1]


class CartPole:
    """CartPole-v1 (render_mode="rgb_array") as a server env: f32[4], Discrete(2), no mask;
    ``info()`` carries the frame as FRAME_HELP says (bytes + frame_shape)."""

    render_mode: str | None = "rgb_array"

    def __init__(self) -> None:
        self.env = gymnasium.make("CartPole-v1", render_mode=self.render_mode)

    def spaces(self) -> Spaces:
        return Spaces(4, 2)

    @staticmethod
    def _result(obs: Any, reward: float, terminated: bool, truncated: bool) -> dict[str, Any]:
        return {
            "observation": np.asarray(obs, dtype=np.float32),
            "reward": float(reward),
            "terminated": bool(terminated),
            "truncated": bool(truncated),
        }

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        obs, _ = self.env.reset(seed=seed)
        return self._result(obs, 0.0, False, False)

    def step(self, action: int) -> dict[str, Any]:
        obs, reward, terminated, truncated, _ = self.env.step(int(action))
        return self._result(obs, float(reward), terminated, truncated)

    def info(self) -> dict[str, Any]:
        frame = self.env.render()
        if frame is None:
            return {}  # render_mode None: nothing to show (the adapter says why)
        return {"frame": np.ascontiguousarray(frame).tobytes(), "frame_shape": list(frame.shape)}


class BlindCartPole(CartPole):
    render_mode = None


@pytest.fixture
def schema_file(tmp_path: Path) -> Path:
    path = tmp_path / "cartpole_frames.toml"
    path.write_text(SCHEMA)
    return path


def reference_frames(num_envs: int) -> list[np.ndarray]:
    """The in-process envs' frames after the same seeded reset and steps."""
    frames = []
    for i in range(num_envs):
        env = gymnasium.make("CartPole-v1", render_mode="rgb_array")
        env.reset(seed=SEED + i)
        for action in ACTIONS:
            env.step(action)
        frames.append(env.render())
        env.close()
    return frames


def side_segments(url: str) -> list[str]:
    name = url.removeprefix("shm://")
    return [f for f in os.listdir(SHM_DIR) if f == f"transport-{name}{SIDE_SUFFIX}"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_render_returns_the_real_cartpole_frame(backend: str, schema_file: Path) -> None:
    num_envs = 2
    with api.Server(
        CartPole, unique_url(backend), schema=schema_file, num_envs=num_envs
    ).start() as server:
        env = RemoteVectorEnv(server.bound_url, schema=schema_file, render_mode="rgb_array")
        try:
            assert env.single_action_space == gymnasium.spaces.Discrete(2)
            assert env.single_observation_space.shape == (4,)
            env.reset(seed=SEED)
            for action in ACTIONS:
                env.step(np.full(num_envs, action))
            frames = env.render()
            assert frames is not None and len(frames) == num_envs
            for got, want in zip(frames, reference_frames(num_envs), strict=True):
                assert got.shape == (400, 600, 3) and got.dtype == np.uint8
                np.testing.assert_array_equal(got, want)
            again = env.render()  # a second render reuses the side segment
            assert again is not None
            np.testing.assert_array_equal(again[0], frames[0])
            if backend == "shm":
                assert side_segments(server.bound_url)
        finally:
            env.close()
    if backend == "shm":  # the server removed its side segment with its region
        assert not side_segments(server.bound_url)


@pytest.mark.parametrize("backend", ["unix", "shm"])
def test_render_with_envs_in_worker_processes(backend: str, schema_file: Path) -> None:
    """Envs in worker processes: their frames come back as in process (the backend's part is
    the same as without workers)."""
    url = unique_url(backend)
    with api.Server(CartPole, url, schema=schema_file, num_envs=2, workers=1).start() as server:
        env = RemoteVectorEnv(server.bound_url, schema=schema_file, render_mode="rgb_array")
        try:
            env.reset(seed=SEED)
            for action in ACTIONS:
                env.step(np.full(2, action))
            frames = env.render()
            assert frames is not None
            for got, want in zip(frames, reference_frames(2), strict=True):
                np.testing.assert_array_equal(got, want)
        finally:
            env.close()


def test_a_discrete_env_without_a_mask_is_discrete_n_over_shm(schema_file: Path) -> None:
    """The control block's act_size is the mask's length (0 here): the spaces come from the
    server's info map, as SPACES_RESP says them over unix."""
    with api.Server(CartPole, unique_url("shm"), schema=schema_file).start() as server:
        with api.connect(server.bound_url, schema_file, timeout=10) as client:
            spaces = client.spaces()
            assert (spaces.obs_n, spaces.act_n) == (4, 2)
            assert "spaces" not in client.server_info  # the same keys as over unix
        env = RemoteEnv(server.bound_url, schema=schema_file)
        try:
            assert env.action_space == gymnasium.spaces.Discrete(2)
        finally:
            env.close()


def test_a_pac_region_still_says_its_spaces() -> None:
    """An env with a mask: SPACES as before (obs 612, the mask's 92)."""
    from transport.envs.echo import EchoEnv

    with api.Server(EchoEnv, unique_url("shm")).start() as server:
        with api.connect(server.bound_url, timeout=10) as client:
            spaces = client.spaces()
            assert (spaces.obs_n, spaces.act_n) == (612, 92)


def test_a_small_info_map_stays_in_its_slot(schema_file: Path) -> None:
    """Only maps larger than the slot's info area use the side segment."""

    class Small(CartPole):
        def info(self) -> dict[str, Any]:
            return {"count": 3}

    with api.Server(Small, unique_url("shm"), schema=schema_file).start() as server:
        with api.connect(server.bound_url, schema_file, timeout=10) as client:
            client.reset()
            _, infos = client.observe()
            assert infos == [{"count": 3}]
            assert not side_segments(server.bound_url)


def test_the_side_segment_grows_when_a_frame_does(schema_file: Path) -> None:
    """A larger map than the segment holds: a new segment (next generation), read by the client."""
    sizes = iter([100_000, 3_000_000, 50_000])

    class Growing(CartPole):
        def info(self) -> dict[str, Any]:
            n = next(sizes)
            return {"frame": bytes(range(256)) * (n // 256), "n": n}

    with api.Server(Growing, unique_url("shm"), schema=schema_file).start() as server:
        with api.connect(server.bound_url, schema_file, timeout=10) as client:
            client.reset()
            for n in (100_000, 3_000_000, 50_000):
                _, infos = client.observe()
                assert infos[0]["n"] == n and len(infos[0]["frame"]) == n // 256 * 256
                assert infos[0]["frame"][:256] == bytes(range(256))
            listed = [s for s in list_segments() if s.name.endswith(SIDE_SUFFIX)]
            mine = [s for s in listed if server.bound_url.removeprefix("shm://") in s.name]
            assert mine and mine[0].state == "SIDE" and not mine[0].stale
            assert mine[0].owner_pid == os.getpid()


@pytest.mark.parametrize("backend", BACKENDS)
def test_render_errors_say_why(backend: str, schema_file: Path) -> None:
    """An env whose info() has no frame (its gymnasium env has render_mode None)."""
    with api.Server(BlindCartPole, unique_url(backend), schema=schema_file).start() as server:
        env = RemoteEnv(server.bound_url, schema=schema_file, render_mode="rgb_array")
        try:
            env.reset(seed=SEED)
            with pytest.raises(AdapterError, match="no 'frame'"):
                env.render()
        finally:
            env.close()
        plain = RemoteEnv(server.bound_url, schema=schema_file)  # render_mode None: no frame
        try:
            plain.reset()
            assert plain.render() is None
        finally:
            plain.close()


def _median_step_us(client: Any, steps: int) -> float:
    times = []
    actions = np.zeros(client.num_envs, dtype=np.uint8)
    for _ in range(steps):
        start = time.perf_counter_ns()
        view = client.step(actions)
        times.append(time.perf_counter_ns() - start)
        if bool(np.any(view.terminated)) or bool(np.any(view.truncated)):
            client.reset()
    return statistics.median(times) / 1e3


def test_steps_that_do_not_render_are_not_slower(schema_file: Path) -> None:
    """Step timing before any render and after renders (the side segment exists): the step
    path never touches it. Printed, not asserted (a shared 2-core machine)."""
    with api.Server(CartPole, unique_url("shm"), schema=schema_file, num_envs=2).start() as server:
        with api.connect(server.bound_url, schema_file, timeout=10) as client:
            client.reset(seed=SEED)
            _median_step_us(client, 200)  # warm up
            before = _median_step_us(client, 1000)
            for _ in range(3):
                _, infos = client.observe()
                assert len(infos[0]["frame"]) == 400 * 600 * 3
            after = _median_step_us(client, 1000)
    print(f"\nshm CartPole x2 step p50: {before:.1f} us before renders, {after:.1f} us after")


# -- the Node server: a JS env that paints a synthetic Atari-sized frame -------------------------

PAINTER = textwrap.dedent(
    """
    "use strict";
    class Painter {
      constructor() { this.t = 0; this.obs = new Float32Array(4); }
      spaces() { return { obsN: 4, actN: 2 }; }
      result() { return { observation: this.obs, reward: 1, terminated: false, truncated: false }; }
      reset(seed) { this.t = 0; this.obs.fill(0); return this.result(); }
      step(a) { this.t += 1; this.obs[0] = this.t; this.obs[1] = a; return this.result(); }
      info() {
        const frame = new Uint8Array(210 * 160 * 3);
        for (let i = 0; i < frame.length; i++) frame[i] = (i * 7 + this.t) & 255;
        return { frame, frame_shape: [210, 160, 3] };
      }
    }
    module.exports = { Painter };
    """
)


def painted(t: int) -> np.ndarray:
    index = np.arange(210 * 160 * 3, dtype=np.int64)
    return ((index * 7 + t) & 255).astype(np.uint8).reshape(210, 160, 3)


@pytest.mark.parametrize("backend", ["unix", "shm"])
def test_node_server_renders_a_synthetic_frame(
    backend: str, schema_file: Path, tmp_path: Path
) -> None:
    require_lang("node")
    module = tmp_path / f"painter_{uuid.uuid4().hex[:8]}.js"
    module.write_text(PAINTER)
    extra = ["--schema", str(schema_file)]
    with ServerProcess(
        unique_url(backend), env=f"{module}:Painter", lang="node", num_envs=2, extra=extra
    ) as server:
        env = RemoteVectorEnv(server.url, schema=schema_file, render_mode="rgb_array")
        try:
            assert env.single_action_space == gymnasium.spaces.Discrete(2)
            env.reset(seed=SEED)
            for action in ACTIONS[:3]:
                env.step(np.full(2, action))
            frames = env.render()
            assert frames is not None
            for frame in frames:
                np.testing.assert_array_equal(frame, painted(3))
        finally:
            env.close()


def test_info_side_marker_is_not_a_length() -> None:
    """INFO_SIDE can never be a real info_len: every slot's info area is smaller."""
    from transport.backends.shm.region import ShmLayout
    from transport.generated import pac_env

    assert ShmLayout.of(pac_env.SCHEMA).info_max < INFO_SIDE
