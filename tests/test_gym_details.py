"""Gymnasium details (issue 15 items 5 and 7): hints that name what exists, bools for flag
fields, and the gymnasium / PettingZoo API against real servers, checked against gymnasium's
own ``SyncVectorEnv`` on the same local env where it applies."""

from __future__ import annotations

import json
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gymnasium")

from gymnasium.vector import SyncVectorEnv

import transport
from transport.api import Server
from transport.envs.mahjong import MahjongEnv
from transport.envs.pac import PacEnv
from transport.errors import AdapterError, ValueTypeError
from transport.generated import pac_env, tetris
from transport.gym import RemoteEnv, RemoteVectorEnv

from .servers import ROOT, ServerProcess, require_lang, unique_url
from .test_episode_ends import ACT_N, NUM_ENVS, LocalWalk, TimeLimitWalk

# -- item 5: hints and flags ---------------------------------------------------------------------


def test_remote_env_hint_names_classes_and_both_ways_to_serve_one_env() -> None:
    with ServerProcess(unique_url("unix"), env="pac", num_envs=4) as server:
        with pytest.raises(AdapterError) as info:
            RemoteEnv(server.url)
    text = str(info.value)
    assert "RemoteVectorEnv" in text and "RemoteVecEnv" in text
    assert "--num-envs 1" in text and "transport.serve(..., num_envs=1)" in text
    assert "num_envs=16" not in text


def test_remote_aec_env_hint_names_both_ways_to_serve_one_table() -> None:
    pytest.importorskip("pettingzoo")
    from transport.pettingzoo import RemoteAECEnv

    with ServerProcess(unique_url("unix"), env="mahjong", num_envs=2) as server:
        with pytest.raises(AdapterError) as info:
            RemoteAECEnv(server.url)
    text = str(info.value)
    assert server.url in text
    assert "--num-envs 1" in text and "transport.serve(..., num_envs=1)" in text


def _result(**changes: Any) -> dict[str, Any]:
    codec = pac_env.SCHEMA["StepResult"]
    values: dict[str, Any] = {f.name: 0 for f in codec.ir.fields}
    values.update(observation=np.zeros(612, np.float32), action_mask=[1] * 92, reward=0.0)
    values.update(changes)
    return values


def test_python_bool_is_accepted_for_flag_fields_only() -> None:
    """``done`` (u8, role done) and ``action_mask`` (u8[92]) are flags; ``rank`` is a number."""
    codec = pac_env.SCHEMA["StepResult"]
    mask = [True, False] * 46
    decoded = codec.decode(codec.encode(_result(done=True, action_mask=mask)))
    assert decoded["done"] == 1
    assert decoded["action_mask"].tolist() == [1, 0] * 46
    assert codec.decode(codec.encode(_result(done=np.bool_(False))))["done"] == 0
    with pytest.raises(ValueTypeError, match="rank"):
        codec.encode(_result(rank=True))


class DictPac(PacEnv):
    """pac whose results are plain dicts with Python bools in the flag fields."""

    def step(self, action: int) -> Any:
        record = super().step(action)
        out: dict[str, Any] = {name: record[name] for name in record.dtype.names or ()}
        out["done"] = bool(record["done"])
        out["action_mask"] = [bool(x) for x in record["action_mask"]]
        return out


def test_an_env_may_return_bools_in_flag_fields() -> None:
    with (
        Server(DictPac, unique_url("unix")).start() as server,
        transport.connect(server.bound_url) as client,
    ):
        client.reset(1)
        result = client.step(0)
        assert result["done"] in (0, 1)


def test_node_codec_takes_booleans_for_flag_fields_only() -> None:
    require_lang("node")
    pac_js = json.dumps(str(ROOT / "node_bridge" / "dist" / "generated" / "pac_env.js"))
    script = (
        f"const pac = require({pac_js});"
        + """
const codec = pac.SCHEMA.structs.StepResult;
const fields = {observation: new Float32Array(612), action_mask: new Array(92).fill(true),
  reward: 0, done: true, rank: 0, life: 0, money: 0, stage: 0, board_size: 0, level: 0,
  synergy_count: 0, items_held: 0, actions_this_turn: 0};
const out = codec.decode(codec.encode(fields));
let refused = "";
try { codec.encode({...fields, rank: true}); } catch (e) { refused = e.constructor.name; }
console.log(JSON.stringify({done: out.done, mask: out.action_mask[0], refused}));
"""
    )
    run = subprocess.run(
        ["node", "-e", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(run.stdout) == {"done": 1, "mask": 1, "refused": "ValueTypeError"}


# -- item 7: call / get_attr / set_attr, render, PettingZoo state ---------------------------------

FRAME_SHAPE = (4, 6, 3)


def frame_for(t: int, seed_mark: float) -> np.ndarray:
    """The frame a FramedWalk shows at step ``t`` (a pure function, so tests can predict it)."""
    frame = np.zeros(FRAME_SHAPE, dtype=np.uint8)
    frame[..., 0] = t % 256
    frame[..., 1] = int(seed_mark * 255)
    return frame


class FramedWalk(TimeLimitWalk):
    """The time-limit walk, rendering a frame of its state in its ``info()`` map."""

    def __init__(self) -> None:
        super().__init__("done")
        self.mark = 0.0

    def reset(self, seed: int | None = None) -> dict[str, Any]:
        result = super().reset(seed)
        self.mark = float(result["observation"][1])
        return result

    def info(self) -> dict[str, Any]:
        frame = frame_for(self.t, self.mark)
        return {"frame": frame.tobytes(), "frame_shape": list(frame.shape)}


@pytest.fixture(scope="module")
def framed_url() -> Iterator[str]:
    """A real server (Unix socket, in this process) of NUM_ENVS framed walks (tetris schema)."""
    with transport.Server(
        FramedWalk, unique_url("unix"), schema=tetris.SCHEMA, num_envs=NUM_ENVS
    ).start() as server:
        yield server.bound_url


def test_get_attr_call_set_attr_as_sync_vector_env(framed_url: str) -> None:
    remote = RemoteVectorEnv(framed_url, schema=tetris.SCHEMA)
    local = SyncVectorEnv([LocalWalk for _ in range(NUM_ENVS)])
    try:
        for name in ("render_mode", "spec"):
            assert remote.get_attr(name) == local.get_attr(name), name
            assert remote.call(name) == local.call(name), name
        for name in ("metadata", "observation_space", "action_space"):
            got, want = remote.get_attr(name), local.get_attr(name)
            assert isinstance(got, tuple) and len(got) == len(want) == NUM_ENVS, name
        assert remote.get_attr("action_space")[0] == local.get_attr("action_space")[0]
        remote.reset(seed=1)
        masks = remote.call("action_masks")
        assert len(masks) == NUM_ENVS and all(m.shape == (ACT_N,) for m in masks)
        with pytest.raises(AdapterError, match="server process"):
            remote.get_attr("walk")
        with pytest.raises(AdapterError, match="server process"):
            remote.set_attr("walk", [None] * NUM_ENVS)
        with pytest.raises(AdapterError, match="render, action_masks"):
            remote.call("close_extras")
    finally:
        remote.close()
        local.close()


def test_vector_env_renders_each_envs_frame(framed_url: str) -> None:
    remote = RemoteVectorEnv(framed_url, schema=tetris.SCHEMA, render_mode="rgb_array")
    local = [FramedWalk() for _ in range(NUM_ENVS)]
    try:
        remote.reset(seed=5)
        for i, env in enumerate(local):
            env.reset(5 + i)
        for k in range(3):
            actions = np.full(NUM_ENVS, k)
            remote.step(actions)
            for env in local:
                if env.terminated or env.truncated:
                    env.reset()  # NEXT_STEP: the step after the end resets
                else:
                    env.step(k)
            frames = remote.render()
            assert frames is not None and len(frames) == NUM_ENVS
            for i, env in enumerate(local):
                assert np.array_equal(frames[i], frame_for(env.t, env.mark)), (k, i)
        assert remote.call("render")[0].shape == FRAME_SHAPE
        assert "rgb_array" in remote.metadata["render_modes"]
    finally:
        remote.close()


def test_remote_env_render_modes() -> None:
    with transport.Server(FramedWalk, unique_url("unix"), schema=tetris.SCHEMA).start() as s:
        env = RemoteEnv(s.bound_url, schema=tetris.SCHEMA, render_mode="rgb_array")
        try:
            env.reset(seed=2)
            frame = env.render()
            assert frame is not None and frame.shape == FRAME_SHAPE and frame.dtype == np.uint8
        finally:
            env.close()
        plain = RemoteEnv(s.bound_url, schema=tetris.SCHEMA)
        try:
            assert plain.render_mode is None and plain.render() is None
        finally:
            plain.close()
    with pytest.raises(AdapterError, match="rgb_array"):
        RemoteEnv("unix:///nonexistent.sock", render_mode="human")


def test_render_without_frames_says_what_the_env_must_declare() -> None:
    from transport.gym import RemoteEnv as Env

    with ServerProcess(unique_url("unix"), env="pac") as server:
        env = Env(server.url, render_mode="rgb_array")
        try:
            env.reset(seed=1)
            with pytest.raises(AdapterError, match=r"'frame'.*frame_shape"):
                env.render()
        finally:
            env.close()


def test_node_env_frames_pass_through(tmp_path: Path) -> None:
    """A Node env's ``info()`` frame (a Uint8Array) reaches ``render()`` unchanged."""
    require_lang("node")
    pac_js = json.dumps(str(ROOT / "node_bridge" / "dist" / "envs" / "pac.js"))
    module = tmp_path / "framed.js"
    module.write_text(
        f"const {{ PacEnv }} = require({pac_js});\n"
        "exports.Framed = () => Object.assign(new PacEnv(), {\n"
        "  info() {\n"
        "    const frame = new Uint8Array(2 * 3 * 3).map((_, i) => (i * 7 + this.steps) % 256);\n"
        "    return { frame, frame_shape: [2, 3, 3] };\n"
        "  },\n"
        "});\n"
    )
    with ServerProcess(unique_url("unix"), env=f"{module}:Framed", lang="node") as server:
        env = RemoteEnv(server.url, render_mode="rgb_array")
        try:
            env.reset(seed=1)
            env.step(0)  # end turn: steps = 1
            frame = env.render()
            want = ((np.arange(18) * 7 + 1) % 256).astype(np.uint8).reshape(2, 3, 3)
            assert frame is not None and np.array_equal(frame, want)
        finally:
            env.close()


class StatefulMahjong(MahjongEnv):
    """Mahjong that serves a global state: the turn and the tiles left."""

    def info(self) -> dict[str, Any]:
        return {"state": [float(self.turn), float(len(self.wall))]}


def test_pettingzoo_state_comes_from_the_env() -> None:
    pytest.importorskip("pettingzoo")
    from transport.generated import mahjong_env
    from transport.pettingzoo import RemoteAECEnv

    with transport.Server(
        StatefulMahjong, unique_url("unix"), schema=mahjong_env.SCHEMA
    ).start() as server:
        env = RemoteAECEnv(server.bound_url)
        local = StatefulMahjong()
        try:
            env.reset(seed=3)
            local.reset(3)
            assert np.array_equal(env.state(), np.asarray(local.info()["state"], np.float32))
            agent = env.agent_selection
            action = int(np.flatnonzero(env.action_mask(agent))[0])
            env.step(action)
            local.step(action)
            state = env.state()
            assert state.dtype == np.float32
            assert np.array_equal(state, np.asarray(local.info()["state"], np.float32))
        finally:
            env.close()
    with ServerProcess(unique_url("unix"), env="mahjong") as plain:
        env = RemoteAECEnv(plain.url)
        try:
            env.reset(seed=3)
            with pytest.raises(AdapterError, match="no global state"):
                env.state()
        finally:
            env.close()


# -- item 7: any list of seeds (RESET_SEEDS) ----------------------------------------------------


@pytest.mark.parametrize("seeds", [[7, 100, 3], [None, 5, None], [9, 9, 9]])
def test_reset_takes_any_list_of_seeds_as_sync_vector_env(seeds: list[int | None]) -> None:
    """Not only s, s+1, ...: each env gets its own seed (None: unseeded), step by step equal."""
    with transport.Server(
        TimeLimitWalk, unique_url("unix"), schema=tetris.SCHEMA, num_envs=NUM_ENVS
    ).start() as server:
        remote = RemoteVectorEnv(server.bound_url, schema=tetris.SCHEMA)
        local = SyncVectorEnv([LocalWalk for _ in range(NUM_ENVS)])
        try:
            obs_r, _ = remote.reset(seed=seeds)
            obs_l, _ = local.reset(seed=seeds)
            assert np.array_equal(obs_r, obs_l)
            for k in range(12):
                actions = np.full(NUM_ENVS, k % ACT_N)
                obs_r, rew_r, term_r, trunc_r, _ = remote.step(actions)
                obs_l, rew_l, term_l, trunc_l, _ = local.step(actions)
                assert np.array_equal(obs_r, obs_l), k
                assert np.array_equal(rew_r, rew_l) and np.array_equal(term_r, term_l), k
                assert np.array_equal(trunc_r, trunc_l), k
            with pytest.raises(AdapterError, match="one seed"):
                remote.reset(seed=[1, 2])
        finally:
            remote.close()
            local.close()


def test_multi_server_batch_takes_a_list_of_seeds() -> None:
    """connect_many: the list is split across the servers (global env i gets seeds[i])."""
    from transport.multi import connect_many

    with (
        transport.Server(
            TimeLimitWalk, unique_url("unix"), schema=tetris.SCHEMA, num_envs=2
        ).start() as first,
        transport.Server(
            TimeLimitWalk, unique_url("unix"), schema=tetris.SCHEMA, num_envs=1
        ).start() as second,
    ):
        with connect_many([first.bound_url, second.bound_url], tetris.SCHEMA) as batch:
            view = batch.reset([11, None, 4], copy=True)
            want = [TimeLimitWalk().reset(s)["observation"] for s in (11, None, 4)]
            assert np.array_equal(view["observation"], np.stack(want))


class FramedPac(PacEnv):
    """pac that renders a frame of its step count."""

    def info(self) -> dict[str, Any]:
        frame = np.full((4, 5, 3), self.steps % 256, np.uint8)
        return {"frame": frame.tobytes(), "frame_shape": list(frame.shape)}


def test_check_env_with_its_render_check() -> None:
    """gymnasium's check_env, render check included, on a rendering env behind a noop server."""
    from gymnasium.utils.env_checker import check_env

    with transport.Server(FramedPac, unique_url("unix"), masked_actions="noop").start() as s:
        env = RemoteEnv(s.bound_url, render_mode="rgb_array")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                check_env(env)
        finally:
            env.close()
