"""The reference envs (echo, pac): determinism, masks, episode ends, and Python/Node byte parity.

The cross-language tests play a seeded random legal policy on the Python env, then replay the
same actions on the Node env through a real ``node`` process (node_bridge/dist/tools/env_trace.js)
and compare every encoded StepResult byte for byte.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from transport.envs import env_factory
from transport.envs.echo import EchoEnv
from transport.envs.pac import PacEnv, seed_state
from transport.generated import pac_env

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "node_bridge" / "dist" / "tools" / "env_trace.js"
STEP = pac_env.StepResult
MAX_STEPS = 200


def encode(record: np.ndarray) -> bytes:
    data = STEP.encode(record)
    STEP.check(data)  # canonical: what the Node side's strict decode accepts
    return data


def legal(record: np.ndarray) -> list[int]:
    return [int(a) for a in np.flatnonzero(record["action_mask"])]


def play_pac(seed: int, policy_seed: int | None = None) -> tuple[list[bytes], list[int]]:
    """One pac episode under a seeded random legal policy: the encoded results and actions."""
    rng = random.Random(seed if policy_seed is None else policy_seed)
    env = PacEnv()
    record = env.reset(seed)
    results = [encode(record)]
    actions: list[int] = []
    while not record["done"]:
        assert len(actions) < MAX_STEPS, f"seed {seed}: no end within {MAX_STEPS} steps"
        action = rng.choice(legal(record))
        actions.append(action)
        record = env.step(action)
        results.append(encode(record))
    return results, actions


def node_trace(env: str, seed: int | None, actions: list[Any]) -> list[bytes]:
    """The Node env's encoded results for this seed and action list (a real node process)."""
    request = json.dumps(
        {"env": env, "seed": None if seed is None else str(seed), "actions": actions}
    )
    done = subprocess.run(
        ["node", str(TRACE)], input=request, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [bytes.fromhex(line) for line in done.stdout.split()]


needs_node = pytest.mark.skipif(
    not TRACE.exists() or shutil.which("node") is None,
    reason=f"{TRACE.relative_to(ROOT)} is missing (cd node_bridge && npm run build) or no node",
)


# -- registry --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["echo", "pac"])
def test_registry_envs_have_the_pac_spaces(name: str) -> None:
    env = env_factory(name)()
    spaces = env.spaces()
    assert (spaces.obs_n, spaces.act_n) == (612, 92)


# -- echo ------------------------------------------------------------------------------------


def test_echo_results() -> None:
    env = EchoEnv()
    reset = STEP.decode(encode(env.reset(5)))
    assert not reset["observation"].any() and reset["action_mask"].all()
    for i, action in enumerate([3, 91, 0], start=1):
        step = STEP.decode(encode(env.step(action)))
        assert step["observation"][0] == action and step["observation"][1] == i
        assert step["reward"] == action / 4 and step["life"] == i and step["done"] == 0


def test_echo_is_deterministic() -> None:
    def run() -> list[bytes]:
        env = EchoEnv()
        return [encode(env.reset(1))] + [encode(env.step(a)) for a in (1, 2, 3, 50, 91)]

    assert run() == run()


# -- pac -------------------------------------------------------------------------------------


def test_pac_same_seed_and_actions_give_the_same_bytes() -> None:
    for seed in (0, 1, 42, 2**64 - 1):
        results, actions = play_pac(seed)
        env = PacEnv()
        replay = [encode(env.reset(seed))] + [encode(env.step(a)) for a in actions]
        assert replay == results


def test_pac_seeds() -> None:
    assert encode(PacEnv().reset(1)) != encode(PacEnv().reset(2))
    assert encode(PacEnv().reset()) == encode(PacEnv().reset(0)), "a fresh env uses seed 0"
    assert seed_state(2**64 - 1) != seed_state(2**32 - 1)
    env, other = PacEnv(), PacEnv()
    first = encode(env.reset(9))
    second = encode(env.reset())  # no seed: the RNG keeps running
    assert second != first
    other.reset(9)
    assert encode(other.reset()) == second
    assert encode(env.reset(9)) == first


def test_pac_random_legal_play() -> None:
    lengths: list[int] = []
    rewards: set[float] = set()
    ranks: set[int] = set()
    masks: set[bytes] = set()
    for seed in range(60):
        results, actions = play_pac(seed, policy_seed=seed * 7 + 1)
        lengths.append(len(actions))
        for data in results:
            r = STEP.decode(data)
            assert r["action_mask"].any(), "at least one legal action"
            assert r["action_mask"][0] == 1, "end turn is always legal"
            assert not r["action_mask"][51:].any(), "reserved actions are masked"
            assert (r["reward"] * 8).is_integer(), "reward is a multiple of 1/8"
            assert np.all(r["observation"] * 256 == np.round(r["observation"] * 256))
            assert 1 <= r["rank"] <= 8
            assert r["board_size"] <= r["level"] <= 9 and r["actions_this_turn"] <= 8
            rewards.add(float(r["reward"]))
            ranks.add(int(r["rank"]))
            masks.add(r["action_mask"].tobytes())
        assert STEP.decode(results[-1])["done"] == 1
    assert min(lengths) >= 10
    assert len(rewards) > 5 and len(ranks) > 2 and len(masks) > 20


def test_pac_writes_in_place_and_refuses_illegal_actions() -> None:
    env = PacEnv()
    out = STEP.zeros()
    env.reset_into(3, out)
    before = out["observation"].copy()
    env.step_into(0, out)
    assert not np.array_equal(before, out["observation"]), "observations follow the state"
    assert bytes(out.tobytes()) == encode(out)
    with pytest.raises(ValueError, match="not legal"):
        env.step_into(60, out)
    with pytest.raises(ValueError, match="not legal"):
        PacEnv().step(0)  # before the first reset


def test_pac_into_matches_reset_and_step() -> None:
    """reset_into/step_into into a dirty buffer give the same bytes as reset/step."""
    results, actions = play_pac(5)
    env = PacEnv()
    out = STEP.zeros()
    out["observation"] = 7.0
    out["money"] = 123
    env.reset_into(5, out)
    got = [out.tobytes()]
    for action in actions:
        env.step_into(action, out)
        got.append(out.tobytes())
    assert got == results


# -- Python vs Node --------------------------------------------------------------------------


@needs_node
@pytest.mark.parametrize("seed", [*range(24), 2**32 + 5, 2**63 + 11, 2**64 - 1])
def test_pac_python_and_node_give_identical_bytes(seed: int) -> None:
    results, actions = play_pac(seed)
    node = node_trace("pac", seed, actions)
    assert len(node) == len(results)
    for i, (py, js) in enumerate(zip(results, node, strict=True)):
        assert py == js, (
            f"seed {seed}: step {i} differs (action {actions[i - 1] if i else 'reset'})"
        )


@needs_node
def test_pac_python_and_node_agree_across_resets() -> None:
    """Unseeded resets continue the RNG identically; reseeding mid-run too."""
    env = PacEnv()
    rng = random.Random(99)
    record = env.reset(None)
    results = [encode(record)]
    script: list[Any] = []
    for episode in range(3):
        while not record["done"]:
            action = rng.choice(legal(record))
            script.append(action)
            record = env.step(action)
            results.append(encode(record))
        entry: Any = "reset" if episode != 1 else {"reset": "77"}
        script.append(entry)
        record = env.reset(None if entry == "reset" else 77)
        results.append(encode(record))
    assert node_trace("pac", None, script) == results


@needs_node
def test_echo_python_and_node_give_identical_bytes() -> None:
    rng = random.Random(3)
    actions: list[Any] = [rng.randrange(92) for _ in range(50)]
    actions[25:25] = ["reset"]
    env = EchoEnv()
    results = [encode(env.reset(1))]
    for action in actions:
        results.append(encode(env.reset() if action == "reset" else env.step(action)))
    assert node_trace("echo", 1, actions) == results
