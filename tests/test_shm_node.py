"""shm:// with the Node server (node_bridge/src/backends/shm.ts): a Python client, real processes.

The Node server must speak the region protocol of docs/shm.md byte for byte: the same results
as the Python shm:// server and the unix:// server, the same errors as status + text, the same
lifecycle (0600 segment, stale replaced, live never, unlinked on SIGINT / SIGTERM, leases).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport.backends.shm import RegionMismatchError, ShmChannel
from transport.backends.shm.region import CONTROL_SIZE, schema_area
from transport.codec import Schema
from transport.errors import ConnectError, FingerprintMismatchError, PeerGoneError, RemoteError
from transport.generated import pac_env
from transport.protocol import AutoReset, ErrorCode
from transport.schema import compile_schema

from .servers import ROOT, ServerProcess, require_lang, stop_process, unique_url
from .test_shm_autoreset import legal, trace
from .test_shm_backend import (
    CLIENT_SCRIPT,
    GAMES,
    PAC,
    play,
    segment_path,
    serve_cli,
    unique_shm_url,
    write_fake_region,
)

SLOT_SIZE = PAC.slot_size
region_size = PAC.region_size


@pytest.fixture(autouse=True)
def _node() -> None:
    require_lang("node")


def node_server(url: str, **kwargs: Any) -> ServerProcess:
    return ServerProcess(url, lang="node", **kwargs)


def test_round_trip_segment_mode_and_info() -> None:
    with node_server(unique_shm_url(1), env="echo") as proc:
        path = segment_path(proc.url)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert region_size(1) == CONTROL_SIZE + SLOT_SIZE + 2576  # then the schema area
        assert os.stat(path).st_size == region_size(1) + len(schema_area(pac_env.SCHEMA))
        with api.connect(proc.url, timeout=5) as client:
            assert client.server_info == {
                "num_envs": 1,
                "env": "echo",
                "server": "node",
                "masked_actions": "reject",
                "autoreset": "disabled",
            }
            assert client.health()
            assert client.spaces().obs_n == 612 and client.spaces().act_n == 92
            client.reset()
            result = client.step(7)
            assert result.observation[0] == 7.0 and result.reward == 1.75 and result.life == 1
            assert client.step(8).life == 2
    assert not os.path.exists(path), "the Node server left its segment"


@pytest.mark.parametrize("wait", ["spin", "futex"])
def test_wait_policies(wait: str) -> None:
    with node_server(unique_shm_url(2) + f"&wait={wait}", env="echo") as proc:
        with api.connect(proc.url, timeout=5) as client:
            client.reset()
            for k in range(200):
                assert client.step([k % 92, 1]).observation[0, 0] == k % 92


def test_batched_32_env_echo_shares_the_mapping() -> None:
    n = 32
    with node_server(unique_shm_url(n), env="echo", num_envs=n) as proc:
        with api.connect(proc.url, timeout=5) as client:
            assert client.num_envs == n
            client.reset(seed=1)
            actions = np.arange(n) % 92
            result = client.step(actions)
            assert isinstance(client.channel, ShmChannel)
            mapping = np.frombuffer(client.channel.region.map, dtype=np.uint8)
            assert result.observation.shape == (n, 612)
            assert result.observation.strides == (SLOT_SIZE, 4)
            for field in ("observation", "action_mask", "reward", "done"):
                assert np.shares_memory(result[field], mapping), field
            np.testing.assert_array_equal(result.observation[:, 0], actions)
            np.testing.assert_array_equal(result.reward, actions / 4)
            for k in range(2, 50):
                again = client.step((actions + k) % 92)
                assert again.observation is result.observation  # refreshed in place
            np.testing.assert_array_equal(result.observation[:, 0], (actions + 49) % 92)
            assert result.life.tolist() == [49] * n
            assert result.action_mask.all()


def test_request_errors_are_remote_errors_and_client_stays_usable() -> None:
    with node_server(unique_shm_url(1), env="pac") as proc:
        with api.connect(proc.url, timeout=5) as client:
            with pytest.raises(RemoteError) as info:
                client.step(0)
            assert info.value.code == ErrorCode.NOT_RESET and "reset" in info.value.text
            result = client.reset(seed=3)
            with pytest.raises(RemoteError) as info:
                client.step(92)
            assert info.value.code == 8 and info.value.name == "INVALID_ACTION"
            assert info.value.text == "env 0: action 92 is outside 0..91"
            with pytest.raises(RemoteError) as info:
                client.step(-1)
            assert info.value.code == ErrorCode.INVALID_ACTION
            assert not result.action_mask[60]
            with pytest.raises(RemoteError) as info:
                client.step(60)
            assert info.value.code == ErrorCode.MASKED_ACTION
            assert client.step(0).observation.shape == (612,)


# -- byte-identical traces -----------------------------------------------------------------------


def test_pac_traces_identical_node_shm_python_shm_and_unix() -> None:
    traces = {}
    for key, url, lang in (
        ("shm/node", unique_shm_url(1), "node"),
        ("shm/python", unique_shm_url(1), "python"),
        ("unix/python", unique_url("unix"), "python"),
    ):
        with ServerProcess(url, env="pac", lang=lang) as proc:
            traces[key] = play(proc.url)
    assert traces["unix/python"][1] > GAMES
    assert traces["shm/node"] == traces["unix/python"]
    assert traces["shm/python"] == traces["unix/python"]


# -- attach checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_auto_reset_modes_are_accepted_per_lease(mode: str) -> None:
    with node_server(unique_shm_url(2), env="echo", num_envs=2) as proc:
        with api.connect(proc.url, timeout=5, autoreset=mode) as client:
            assert client.autoreset == AutoReset[mode.upper()]
            assert client.server_info["autoreset"] == mode
            client.reset()
            assert client.step([1, 2]).observation[:, 0].tolist() == [1.0, 2.0]
            assert client.finals == []
        with api.connect(proc.url, timeout=5) as client:  # a new lease: disabled again
            assert client.autoreset == AutoReset.DISABLED
            assert client.server_info["autoreset"] == "disabled"
            client.reset()
            assert client.step([3, 4]).observation[:, 0].tolist() == [3.0, 4.0]


def _digest(records: list[bytes]) -> str:
    return hashlib.sha256(b"".join(len(r).to_bytes(4, "little") + r for r in records)).hexdigest()


@pytest.fixture(scope="module")
def pac4() -> Iterator[dict[str, ServerProcess]]:
    """A 4-env pac server over shm per language, for the module's tests that compare the two
    languages: each comparison is a lease of its own per server, started with a seeded reset."""
    with (
        ServerProcess(unique_shm_url(4), env="pac", lang="node", num_envs=4) as node,
        ServerProcess(unique_shm_url(4), env="pac", lang="python", num_envs=4) as python,
    ):
        yield {"node": node, "python": python}


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_auto_reset_pac_traces_identical_node_shm_and_python_shm(
    mode: str, pac4: dict[str, ServerProcess]
) -> None:
    """Results and finals of a seeded random walk (4 pac envs), byte for byte."""
    traces = {lang: trace(pac4[lang].url, mode) for lang in ("node", "python")}
    assert len(traces["node"]) == len(traces["python"]) >= 301
    if mode == "same_step":
        assert len(traces["node"]) > 301  # finals interleaved
    assert _digest(traces["node"]) == _digest(traces["python"])
    assert traces["node"] == traces["python"]


def test_same_step_finals_are_views_of_the_node_final_areas() -> None:
    with node_server(unique_shm_url(4), env="pac", num_envs=4) as proc:
        with api.connect(proc.url, timeout=10, autoreset="same_step") as client:
            assert isinstance(client.channel, ShmChannel) and client.channel.region.has_finals
            mapping = np.frombuffer(client.channel.region.map, dtype=np.uint8)
            result, rng, ended = client.reset(seed=7), __import__("random").Random(7), 0
            for _ in range(600):
                result = client.step(legal(result, rng))
                for index, final in client.finals:
                    ended += 1
                    assert final.done == 1 and result.done[index] == 0
                    assert np.shares_memory(final.observation, mapping)
                    assert not np.shares_memory(final.observation, result.observation)
                assert not result.done.any()
            assert ended >= 4


def test_next_step_disabled_and_same_step_refusals_match_python(
    pac4: dict[str, ServerProcess],
) -> None:
    """NEXT_STEP: a done env's action is ignored (even an invalid one); DISABLED: NOT_RESET."""
    for mode in ("disabled", "next_step"):
        texts = {}
        for lang in ("node", "python"):
            with api.connect(pac4[lang].url, timeout=10, autoreset=mode) as client:
                result, rng = client.reset(seed=3), __import__("random").Random(3)
                out: list[Any] = []
                for _ in range(400):
                    actions = legal(result, rng)
                    if result.done.any():
                        actions[int(np.flatnonzero(result.done)[0])] = 500
                    try:
                        result = client.step(actions)
                        out.append(result.observation.tobytes())
                    except RemoteError as exc:
                        out.append((exc.code, exc.text))
                        break
                texts[lang] = out
        assert texts["node"] == texts["python"], mode


def test_gym_vector_env_over_node_shm_next_step() -> None:
    from gymnasium.vector import AutoresetMode

    from transport.gym import RemoteVectorEnv

    with node_server(unique_shm_url(4), env="pac", num_envs=4) as proc:
        for mode in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            env = RemoteVectorEnv(proc.url, 4, autoreset_mode=mode)
            try:
                env.reset(seed=4)
                rng, dones, finals = np.random.default_rng(4), 0, 0
                for _ in range(300):
                    masks = env.action_masks()
                    actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
                    _, _, terminated, _, infos = env.step(actions)
                    dones += int(terminated.sum())
                    if mode == AutoresetMode.SAME_STEP and "final_obs" in infos:
                        finals += int(infos["_final_obs"].sum())
                        assert (terminated[infos["_final_obs"]]).all()
                assert dones >= 1
                assert mode == AutoresetMode.NEXT_STEP or finals >= 1
            finally:
                env.close()


def test_wrong_fingerprint_and_num_envs_are_clear_errors() -> None:
    with node_server(unique_shm_url(4), env="echo", num_envs=4) as proc:
        text = (
            (ROOT / "schema" / "pac_env.toml")
            .read_text()
            .replace('"rank"', '"rank_other"')
            .replace('shm = "pac_shm"', "")
        )
        other = Schema(compile_schema(text))
        with pytest.raises(FingerprintMismatchError) as info:
            api.connect(proc.url, schema=other, timeout=5)
        message = str(info.value)
        assert pac_env.FINGERPRINT_HEX in message and f"{other.fingerprint:016x}" in message
        name = proc.url.partition("://")[2].partition("?")[0]
        with pytest.raises(RegionMismatchError) as minfo:
            api.connect(f"shm://{name}?num_envs=7", timeout=5)
        assert "num_envs" in str(minfo.value) and "expected 7" in str(minfo.value)
        assert "found 4" in str(minfo.value)
        with api.connect(proc.url, timeout=5) as client:  # the refused attaches took no lease
            client.reset()


# -- dead peers, leases, lifecycle ---------------------------------------------------------------


def test_node_server_killed_during_step_is_peer_gone_within_1s() -> None:
    proc = node_server(unique_shm_url(1), env="echo")
    client = api.connect(proc.url, timeout=10)
    client.reset()
    stop_process(proc.proc.pid)  # every thread stopped: the next step stays outstanding
    errors: list[BaseException] = []
    finished = threading.Event()

    def step() -> None:
        try:
            client.step(1)
        except BaseException as exc:
            errors.append(exc)
        finished.set()

    thread = threading.Thread(target=step)
    thread.start()
    time.sleep(0.2)
    assert not finished.is_set()
    os.kill(proc.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert finished.wait(5)
    assert time.monotonic() - killed < 1.0
    assert len(errors) == 1 and isinstance(errors[0], PeerGoneError)
    client.close()
    proc.kill()
    listed = json.loads(serve_cli("--list-shm", "--json").stdout)
    mine = [r for r in listed if r["path"] == segment_path(proc.url)]
    assert len(mine) == 1 and mine[0]["stale"] and not mine[0]["owner_alive"]
    # a new Node server replaces the dead one's region
    with node_server(proc.url, env="echo") as again:
        with api.connect(again.url, timeout=5) as client2:
            client2.reset()
            assert client2.step(5).observation[0] == 5.0


def test_killed_client_lease_is_reclaimed_and_server_keeps_serving() -> None:
    n = 4
    with node_server(unique_shm_url(n), env="echo", num_envs=n) as server:
        child = subprocess.Popen(
            [sys.executable, "-c", CLIENT_SCRIPT, server.url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "attached"
            with pytest.raises(ConnectError) as info:
                api.connect(server.url, timeout=1)
            assert f"client pid {child.pid}" in str(info.value)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(5)
            with api.connect(server.url, timeout=5) as client:
                result = client.reset()
                assert result.life.tolist() == [0] * n  # fresh envs for the new lease
                assert client.step([6] * n).observation[:, 0].tolist() == [6.0] * n
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        with api.connect(server.url, timeout=5) as client:  # a closed client frees the lease too
            client.reset()
            assert client.step([1] * n).life.tolist() == [1] * n  # a new session: fresh envs


def test_second_server_on_a_live_name_fails_clearly() -> None:
    with node_server(unique_shm_url(1), env="echo") as first:
        for lang in ("node", "python"):
            second = serve_cli(first.url, "--lang", lang)
            assert second.returncode == 1, second.stderr
            assert "in use by a live server" in second.stderr
            assert f"pid {first.proc.pid}" in second.stderr
        with api.connect(first.url, timeout=5) as client:
            assert client.health()
    with ServerProcess(unique_shm_url(1), env="echo") as python_first:
        second = serve_cli(python_first.url, "--lang", "node")
        assert second.returncode == 1 and "in use by a live server" in second.stderr


def test_stale_region_is_replaced_on_start() -> None:
    url = unique_shm_url(1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_fake_region(url, owner_pid=dead.pid, owner_start_time=1)
    with node_server(url, env="echo") as proc:
        with api.connect(proc.url, timeout=5) as client:
            client.reset()
            assert client.step(3).observation[0] == 3.0


def test_client_sees_clean_shutdown_as_peer_gone() -> None:
    proc = node_server(unique_shm_url(1), env="echo")
    client = api.connect(proc.url, timeout=5)
    client.reset()
    proc.terminate()
    proc.kill()
    with pytest.raises(PeerGoneError):
        client.step(1)
    client.close()


def test_too_many_envs_are_refused_at_start() -> None:
    url = unique_shm_url(10**9)  # 5 TB of slots: over MAX_NUM_ENVS (docs/decisions.md)
    result = serve_cli(url, "--lang", "node")
    assert result.returncode == 2
    assert "--num-envs must be 1..65536, not 1000000000" in result.stderr
    assert not os.path.exists(segment_path(url))


def test_bad_urls_are_refused_by_the_node_server() -> None:
    for url in ("shm://", "shm://a/b", "shm://x?num_envs=0", "shm://x?bogus=1", "shm://x?wait=nap"):
        result = serve_cli(url, "--lang", "node")
        assert result.returncode == 1 and "transport-serve: error:" in result.stderr, url
