"""Served gymnasium envs (``GymEnv``) and PettingZoo tables (``AECServerEnv``) write their
results straight into the result record (``step_into``/``reset_into``), byte for byte what the
validated mapping path writes.

The defect it fixes: every result of these adapters went through the codec's mapping path (a
dict, its validation, NaN canonicalisation), which made the runtime 2.5-9x slower than
gymnasium's own ``SyncVectorEnv`` on classic-control envs (CartPole N = 64: 86 against 21 us
per env in process) and a served tic-tac-toe game 2x the game itself (benchmarks/RESULTS.md).
Results whose values are not stored as they are (another dtype, a list, a wrong shape) still go
through the mapping, so its errors and conversions stay.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import transport
from transport.envs.gym_env import GymEnv
from transport.errors import RemoteError
from transport.gym_serve import gym_schema, gym_server
from transport.protocol import body_codec

from .servers import unique_url
from .test_gym_serve import RICH_ID
from .test_real_envs import MUJOCO_MISSING

ENV_IDS = [
    "CartPole-v1",
    "MountainCarContinuous-v0",
    "FrozenLake-v1",
    "Blackjack-v1",
    RICH_ID,
    *([] if MUJOCO_MISSING else ["Hopper-v5"]),
]


def _trajectory(env: GymEnv, codec: Any, in_place: bool, steps: int) -> list[bytes]:
    """The record bytes of a seeded reset and ``steps`` seeded random steps (resets at ends)."""
    record = codec.zeros()

    def put(output: Any) -> bytes:
        if in_place:
            assert output is None, "the result went through the mapping path"
            return record.tobytes()
        return bytes(codec.encode(output))

    out = [put(env.reset_into(5, record) if in_place else env.reset(5))]
    env.env.action_space.seed(5)
    for _ in range(steps):
        action = env.env.action_space.sample()
        out.append(put(env.step_into(action, record) if in_place else env.step(action)))
        ends = codec.view(bytearray(out[-1]))
        if ends["terminated"] or ends["truncated"]:
            out.append(put(env.reset_into(None, record) if in_place else env.reset(None)))
    return out


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_real_envs_write_in_place_the_bytes_of_the_mapping_path(env_id: str) -> None:
    """The env on one seed, written in place, then through ``step`` (a mapping the codec
    encodes), one after the other (envs of one class may share a space's RNG): the same
    record bytes at every reset and step."""
    codec = body_codec(gym_schema(env_id), "STEP_RESP")
    fast = _trajectory(GymEnv(env_id), codec, True, 60)
    slow = _trajectory(GymEnv(env_id), codec, False, 60)
    assert len(fast) == len(slow) > 60
    for t, (got, want) in enumerate(zip(fast, slow, strict=True)):
        assert got == want, t


class OddEnv(gymnasium.Env[Any, Any]):
    """Returns observations of the kind chosen by ``kind`` for a float32 Box(3) space."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def _obs(self) -> Any:
        if self.kind == "float64":  # another dtype: converted by the mapping path
            return np.array([0.1, 0.2, 0.3])
        if self.kind == "list":
            return [1.0, 2.0, 3.0]
        if self.kind == "short":  # a wrong shape: the mapping path's error
            return np.zeros(2, np.float32)
        if self.kind == "nan":  # x86's default NaN (sign bit set) and a payload NaN
            raw = struct.pack("<3I", 0xFFC00000, 0x7FC00001, 0x3F800000)
            return np.frombuffer(raw, np.float32).copy()
        return np.ones(3, np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reward = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]  # -nan
        return self._obs(), reward if self.kind == "nan" else 1.0, False, False, {}


@pytest.mark.parametrize("kind", ["float64", "list"])
def test_leaves_not_stored_as_they_are_go_through_the_mapping(kind: str) -> None:
    env = GymEnv(lambda: OddEnv(kind))
    codec = body_codec(gym_schema(lambda: OddEnv(kind)), "STEP_RESP")
    record = codec.zeros()
    output = env.step_into(0, record)
    assert isinstance(output, dict)  # the runtime validates and writes it
    assert codec.encode(output) == codec.encode(env.step(0))
    want = [0.1, 0.2, 0.3] if kind == "float64" else [1.0, 2.0, 3.0]
    assert codec.view(codec.encode(output))["observation"].tolist() == np.float32(want).tolist()


def test_nans_are_written_canonical_in_place() -> None:
    env = GymEnv(lambda: OddEnv("nan"))
    codec = body_codec(gym_schema(lambda: OddEnv("nan")), "STEP_RESP")
    record = codec.zeros()
    assert env.step_into(0, record) is None
    obs = record["observation"].view(np.uint32)
    assert [hex(x) for x in obs] == ["0x7fc00000", "0x7fc00000", "0x3f800000"]
    assert record["reward"].view(np.uint64) == 0x7FF8000000000000
    assert record.tobytes() == codec.encode(env.step(0))


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_a_wrong_shape_is_still_the_codecs_error(scheme: str) -> None:
    with gym_server(lambda: OddEnv("short"), unique_url(scheme), num_envs=2).start() as server:
        with transport.connect(server.bound_url, timeout=30) as client:
            with pytest.raises(RemoteError, match="observation: expected 3 elements, got 2"):
                client.reset()


@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_served_odd_envs_equal_their_mapping_bytes(scheme: str) -> None:
    """In place and through the mapping, in one server, over a socket and over shm."""
    for kind in ("float64", "nan", "ones"):
        make = functools.partial(OddEnv, kind)
        codec = body_codec(gym_schema(make), "STEP_RESP")
        local = GymEnv(make)
        with gym_server(make, unique_url(scheme), num_envs=2).start() as srv:
            with transport.connect(srv.bound_url, timeout=30) as client:
                client.reset(seed=1)
                view = client.step([0, 1])
                want = codec.encode(local.step(0))
                for i in range(2):
                    assert view.record[i].tobytes() == want, (kind, i)


@pytest.mark.parametrize("game", ["tictactoe_v3", "connect_four_v3", "go_v5"])
def test_pettingzoo_tables_write_in_place_the_bytes_of_the_mapping_path(game: str) -> None:
    """The AEC server env (``transport.pettingzoo.AECServerEnv``): whole games on one seed,
    in place and through the mapping, the same record bytes after every move."""
    classic = pytest.importorskip("pettingzoo.classic")
    from transport.pettingzoo import AECServerEnv, aec_schema

    make = getattr(classic, game).env
    if game == "go_v5":  # bool planes; a small board keeps the games short
        make = functools.partial(make, board_size=5, komi=0.5)
    codec = body_codec(aec_schema(make), "STEP_RESP")
    fast, slow, record = AECServerEnv(make), AECServerEnv(make), codec.zeros()
    rng = np.random.default_rng(3)
    for game_seed in range(3):
        assert fast.reset_into(game_seed, record) is None
        assert record.tobytes() == codec.encode(slow.reset(game_seed))
        while not (record["terminated"] or record["truncated"]):
            move = int(rng.choice(np.flatnonzero(record["action_mask"])))
            assert fast.step_into(move, record) is None
            assert record.tobytes() == codec.encode(slow.step(move))
