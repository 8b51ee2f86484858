"""Decision-boundary runs (issue 14 item 3, seed 004) over real servers of both languages: the
frames env's runs carry frames and event counters, the runtime's no-progress watchdog answers a
stalled env as a NoProgressError (request numbers, last state; the env restarted), and the
adapters' ``on_no_progress`` policy: raise (default) or truncate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import transport
from transport.errors import NoProgressError, SchemaError
from transport.schema import compile_schema

from .servers import ServerProcess, unique_url

SCHEMES = ("unix", "shm")
"""One socket backend and shm (its error text lives in the slot): the watchdog is the runtime's
and NoProgressError the client's parse of an env error's text; tests/test_contract.py's
env_error check carries an env error's env id and text over every backend."""
LANGS = ("python", "node")
FRAMES_TOML = Path(__file__).resolve().parents[1] / "schema" / "frames.toml"
JAM, SPIN = 2, 3


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_runs_carry_frames_and_the_watchdog_fires(scheme: str, lang: str) -> None:
    with (
        ServerProcess(unique_url(scheme), env="frames", num_envs=2, lang=lang) as server,
        transport.connect(server.url) as client,
    ):
        client.reset(5)
        view = client.step([0, 1], copy=True)
        assert ((1 <= view.frames) & (view.frames < 64)).all()
        assert view.events[:, 2].tolist() == [1, 1]  # one spawn per run
        assert (view.events[:, 0] == view.frames // 4).all()  # a drop every 4 frames
        assert np.allclose(view.observation[:, 2] * 64, view.frames)
        client.step([JAM, 0])  # env 0 runs 0 frames from now on
        client.step([0, 0])
        with pytest.raises(NoProgressError) as caught:
            client.step([0, 0])
        error = caught.value
        assert error.env_id == 0
        assert error.requests == (2, 4)  # its 2nd, 3rd and 4th requests since the reset
        assert error.last_state["frames"] == 0 and error.last_state["decisions"] == 1
        assert error.last_state["events"] == [0, 0, 0, 0]
        view = client.step([0, 0], copy=True)  # the server restarted env 0: it advances again
        assert (view.frames >= 1).all() and view.decisions[0] == 1
        with pytest.raises(NoProgressError, match="no decision within 64 frames") as spun:
            client.step([0, SPIN])
        assert spun.value.env_id == 1 and spun.value.requests == (6, 6)  # its 6th request


def test_python_and_node_envs_give_the_same_bytes() -> None:
    results = []
    for lang in LANGS:
        with (
            ServerProcess(unique_url("unix"), env="frames", num_envs=1, lang=lang) as server,
            transport.connect(server.url) as client,
        ):
            out = [client.reset(9, copy=True)]
            out += [client.step(k % 2, copy=True) for k in range(20)]
            results.append(b"".join(np.asarray(v[k]).tobytes() for v in out for k in v.keys()))
    assert results[0] == results[1]


@pytest.mark.parametrize("lang", LANGS)
def test_remote_env_truncates_a_stalled_episode(lang: str) -> None:
    from transport.gym import RemoteEnv

    with ServerProcess(unique_url("unix"), env="frames", num_envs=1, lang=lang) as server:
        env = RemoteEnv(server.url, on_no_progress="truncate")
        try:
            env.reset(seed=1)
            env.step(JAM)
            env.step(0)
            obs, reward, terminated, truncated, info = env.step(0)
            assert truncated and not terminated and reward == 0.0
            assert "NoProgressError" in info["no_progress"]
            assert info["last_state"]["frames"] == 0
            assert obs[7] == 0.0 and obs[0] == 0.0  # the restarted engine: not jammed, fresh
            env.reset()
            assert env.step(0)[0][2] > 0  # it advances
        finally:
            env.close()
        strict = RemoteEnv(server.url)  # default: raise
        try:
            strict.reset(seed=1)
            with pytest.raises(NoProgressError):
                strict.step(SPIN)
        finally:
            strict.close()


def test_vector_env_truncates_only_the_stalled_env() -> None:
    from transport.gym import RemoteVectorEnv

    with ServerProcess(unique_url("shm"), env="frames", num_envs=3, lang="node") as server:
        envs = RemoteVectorEnv(server.url, on_no_progress="truncate")
        try:
            envs.reset(seed=3)
            obs, rewards, terminated, truncated, infos = envs.step(np.array([0, SPIN, 0]))
            assert rewards[1] == 0.0 and not terminated.any()
            assert truncated.tolist() == [False, True, False]
            assert infos["_no_progress"].tolist() == [False, True, False]
            assert obs[1, 0] == 0.0  # env 1 restarted: no decisions yet
            assert (obs[[0, 2], 0] > 0).all()  # the others made their decision
        finally:
            envs.close()
        with pytest.raises(ValueError, match="on_no_progress"):
            RemoteVectorEnv(server.url, on_no_progress="ignore")


def test_sb3_vec_env_truncates_a_stalled_env() -> None:
    from transport.sb3 import RemoteVecEnv

    with ServerProcess(unique_url("unix"), env="frames", num_envs=2) as server:
        venv = RemoteVecEnv(server.url, on_no_progress="truncate")
        try:
            venv.reset()
            venv.step_async(np.array([SPIN, 0]))
            _, rewards, dones, infos = venv.step_wait()
            assert rewards[0] == 0.0
            assert dones.tolist() == [True, False]
            assert "NoProgressError" in infos[0]["env_error"]
            assert infos[0]["TimeLimit.truncated"]
        finally:
            venv.close()


def test_schema_rules_for_the_new_roles() -> None:
    text = FRAMES_TOML.read_text()
    ir = compile_schema(text)
    assert ir.env is not None and (ir.env.max_frames, ir.env.stall_requests) == (64, 3)
    # the IR carries the keys only when declared: other schemas' fingerprints are unchanged
    plain = text.replace("max_frames = 64\nstall_requests = 3\n", "")
    plain_ir = compile_schema(plain)
    assert plain_ir.env is not None and "max_frames" not in plain_ir.env.to_json()
    assert plain_ir.fingerprint != ir.fingerprint
    with pytest.raises(SchemaError, match="u32"):
        compile_schema(
            text.replace('type = "u32",    role = "frames"', 'type = "u16",    role = "frames"')
        )
    with pytest.raises(SchemaError, match="integer array"):
        compile_schema(
            text.replace('type = "u32[4]", role = "events"', 'type = "f32[4]", role = "events"')
        )
    no_frames = text.replace(',    role = "frames"', "")
    with pytest.raises(SchemaError, match='role "frames"'):
        compile_schema(no_frames)
    with pytest.raises(SchemaError, match="max_frames"):
        compile_schema(text.replace("max_frames = 64", "max_frames = 0"))


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_auto_resets_are_not_stalls(mode: str, lang: str) -> None:
    """A reset's result has frames 0: the watchdog counts only the envs that stepped, so
    episodes that end and auto-reset (either mode) never look like no progress."""
    with (
        ServerProcess(unique_url("unix"), env="frames", num_envs=2, lang=lang) as server,
        transport.connect(server.url, autoreset=mode) as client,
    ):
        client.reset(1)
        ends = 0
        for _ in range(80):  # three episodes of 24 decisions per env
            view = client.step([0, 1])
            ends += int(view.terminated.sum()) + len(client.finals)
        assert ends >= 4


@pytest.mark.parametrize("lang", LANGS)
def test_the_watchdog_runs_with_worker_pools(lang: str) -> None:
    with (
        ServerProcess(
            unique_url("unix"), env="frames", num_envs=2, lang=lang, extra=["--workers", "2"]
        ) as server,
        transport.connect(server.url) as client,
    ):
        client.reset(2)
        with pytest.raises(NoProgressError) as caught:
            client.step([0, SPIN])
        assert caught.value.env_id == 1
        assert client.step([0, 0]).frames.min() >= 1  # env 1 restarted in its worker


NODE_CLIENT = """
const { connect, NoProgressError } = require(process.argv[1]);
(async () => {
  const client = await connect(process.argv[2]);
  await client.reset(1n);
  try {
    await client.step(3);
    console.log(JSON.stringify({ raised: false }));
  } catch (e) {
    const typed = e instanceof NoProgressError;
    const out = { raised: typed, env: e.envId, requests: e.requests, state: e.lastState };
    console.log(JSON.stringify(out));
  }
  await client.close();
})();
"""


@pytest.mark.parametrize("lang", LANGS)
def test_node_client_raises_no_progress_error(lang: str) -> None:
    """The Node client parses either server language's watchdog text into NoProgressError."""
    import json
    import subprocess

    index = str(FRAMES_TOML.parents[1] / "node_bridge" / "dist" / "index.js")
    with ServerProcess(unique_url("unix"), env="frames", lang=lang) as server:
        done = subprocess.run(
            ["node", "-e", NODE_CLIENT, index, server.url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    got = json.loads(done.stdout or "{}")
    assert got.get("raised") is True, done.stdout + done.stderr
    assert got["env"] == 0 and got["requests"] == [1, 1] and got["state"]["frames"] == 64


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("scheme", ["unix", "shm"])
def test_the_watchdog_counts_asynchronous_steps(scheme: str, workers: int, lang: str) -> None:
    """send / recv count toward the watchdog as lock-step steps do: a jammed env fails its third
    stalled request with NoProgressError (in process and in worker processes or threads)."""
    extra = ["--workers", str(workers)] if workers else []
    with (
        ServerProcess(unique_url(scheme), env="frames", num_envs=2, lang=lang, extra=extra) as s,
        transport.connect(s.url, autoreset="next_step") as client,
    ):
        client.async_reset(2)
        assert sorted(client.recv(2).env_ids.tolist()) == [0, 1]
        client.send([JAM], [0])  # env 0 runs 0 frames from now on (its 1st request)
        client.recv(1)
        client.send([0], [0])
        client.recv(1)
        client.send([0], [0])
        with pytest.raises(NoProgressError) as caught:
            client.recv(1)
        assert caught.value.env_id == 0
        assert caught.value.requests == (1, 3)
        client.send([0], [0])  # the server restarted env 0: it advances again
        assert client.recv(1).results.frames.min() >= 1
