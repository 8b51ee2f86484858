"""shm:// against real server processes: zero copy, errors, dead peers, leases, stale regions."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from typing import Any

import numpy as np
import pytest

import transport.api as api
from transport import native
from transport.backends.shm import RegionMismatchError
from transport.backends.shm.region import (
    CONTROL_SIZE,
    MAGIC,
    RegionState,
    ShmLayout,
    own_start_time,
    schema_area,
)
from transport.errors import (
    ConnectError,
    PeerGoneError,
    RemoteError,
    VersionMismatchError,
)
from transport.generated import pac_env, pac_shm
from transport.protocol import ErrorCode

from .servers import ROOT, ServerProcess, stop_process, unique_url

N = 4
PAC = ShmLayout.of(pac_env.SCHEMA)  # the pac_shm profile: Appendix B
SLOT_SIZE = PAC.slot_size
region_size = PAC.region_size


def unique_shm_url(num_envs: int | None = None) -> str:
    name = f"test-{uuid.uuid4().hex[:12]}"
    return f"shm://{name}" + (f"?num_envs={num_envs}" if num_envs else "")


def segment_path(url: str) -> str:
    return "/dev/shm/transport-" + url.partition("://")[2].partition("?")[0]


def serve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transport.tools.serve_cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def remove(url: str) -> None:
    try:
        native.shm_unlink("/" + os.path.basename(segment_path(url)))
    except FileNotFoundError:
        pass


@pytest.fixture
def server() -> Any:
    with ServerProcess(unique_shm_url(N), env="echo") as proc:
        yield proc
    assert not os.path.exists(segment_path(proc.url)), "the server left its segment"


@pytest.fixture
def server1() -> Any:
    with ServerProcess(unique_shm_url(1), env="echo") as proc:
        yield proc


def mapping_of(client: Any) -> np.ndarray:
    return np.frombuffer(client.channel.region.map, dtype=np.uint8)


# -- basics and zero copy ----------------------------------------------------------------------


def test_round_trip_segment_mode_and_info(server1: ServerProcess) -> None:
    path = segment_path(server1.url)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # the Appendix B region, then the schema area the region carries (discovery)
    assert os.stat(path).st_size == region_size(1) + len(schema_area(pac_env.SCHEMA))
    with api.connect(server1.url, timeout=5) as client:
        assert client.num_envs == 1
        assert client.server_info == {
            "num_envs": 1,
            "env": "echo",
            "server": "python",
            "masked_actions": "reject",
            "autoreset": "disabled",
        }
        assert client.health()
        assert client.spaces().obs_n == 612 and client.spaces().act_n == 92
        client.reset()
        result = client.step(7)
        assert result.observation.shape == (612,)
        assert result.observation[0] == 7.0 and result.reward == 1.75 and result.life == 1
        assert client.step(8).life == 2


def test_batched_step_views_share_the_mapping(server: ServerProcess) -> None:
    with api.connect(server.url, timeout=5) as client:
        client.reset(seed=1)
        result = client.step(np.arange(N))
        mapping = mapping_of(client)
        assert result.observation.shape == (N, 612) and result.observation.dtype == np.float32
        assert result.observation.strides == (SLOT_SIZE, 4)
        assert result.action_mask.shape == (N, 92)
        assert result.reward.shape == (N,) and result.done.shape == (N,)
        for field in ("observation", "action_mask", "reward", "done"):
            assert np.shares_memory(result[field], mapping), field
        np.testing.assert_array_equal(result.observation[:, 0], np.arange(N))
        again = client.step([5] * N)
        assert again.observation is result.observation  # the same views, refreshed in place
        owned = client.step([3] * N, copy=True)
        assert not np.shares_memory(owned.observation, mapping)
        client.step([4] * N)
        assert (owned.observation[:, 0] == 3).all()  # a copy does not change with later steps


def test_no_allocation_over_10000_steps(server1: ServerProcess) -> None:
    with api.connect(server1.url, timeout=5) as client:
        client.reset()
        for _ in range(500):
            client.step(1)
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for _ in range(10_000):
                client.step(1)
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        growth = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert growth < 2048, f"{growth} bytes allocated over 10,000 steps"


def test_torch_from_numpy_shares_the_region(server: ServerProcess) -> None:
    torch = pytest.importorskip("torch")
    with api.connect(server.url, timeout=5) as client:
        client.reset()
        result = client.step([2] * N)
        tensor = torch.from_numpy(result.observation)
        assert tensor.data_ptr() == result.observation.ctypes.data
        client.step([9] * N)
        assert float(tensor[N - 1, 0]) == 9.0  # the tensor sees the next step: no copy


# -- errors travel as a status code + text ---------------------------------------------------


class Exploding:
    def __init__(self) -> None:
        from transport.envs.echo import EchoEnv

        self.inner = EchoEnv()

    def spaces(self) -> Any:
        return self.inner.spaces()

    def reset(self, seed: int | None = None) -> Any:
        return self.inner.reset(seed)

    def step(self, action: int) -> Any:
        if action == 13:
            raise ValueError("unlucky action")
        return {
            "observation": [float(action)] * 612,
            "action_mask": [1] * 92,
            "reward": 0.5,
            "done": 0,
            "rank": 1,
            "life": 1,
            "money": 2,
            "stage": 3,
            "board_size": 0,
            "level": 1,
            "synergy_count": 0,
            "items_held": 0,
            "actions_this_turn": 4,
        }


def test_env_error_and_envs_without_step_into() -> None:
    url = unique_shm_url(2)
    with api.Server(Exploding, url).start():
        with api.connect(url, timeout=5) as client:
            client.reset()
            result = client.step([1, 2])
            assert result.actions_this_turn.tolist() == [4, 4]
            np.testing.assert_array_equal(result.observation[:, 5], [1.0, 2.0])
            with pytest.raises(RemoteError) as info:
                client.step([1, 13])
            assert info.value.code == ErrorCode.ENV_ERROR and "unlucky" in info.value.text
            assert client.step([3, 3]).observation[1, 0] == 3.0
    assert not os.path.exists(segment_path(url))


# -- attach checks -----------------------------------------------------------------------------


def test_wrong_num_envs_names_field_expected_found(server: ServerProcess) -> None:
    name = server.url.partition("://")[2].partition("?")[0]
    with pytest.raises(RegionMismatchError) as info:
        api.connect(f"shm://{name}?num_envs=7", timeout=5)
    assert "num_envs" in str(info.value) and "expected 7" in str(info.value)
    assert f"found {N}" in str(info.value)


def write_fake_region(url: str, **fields: int) -> None:
    """A READY region owned by this (live) process, with control fields overridden."""
    segment = "/" + os.path.basename(segment_path(url))
    fd = native.shm_create(segment, region_size(1))
    try:
        header = pac_shm.ControlBlock.zeros()
        values = {
            "magic": MAGIC,
            "version": 1,
            "num_envs": 1,
            "obs_size": 612,
            "act_size": 92,
            "slot_size": SLOT_SIZE,
            "fingerprint": pac_env.FINGERPRINT,
            "owner_pid": os.getpid(),
            "owner_start_time": own_start_time(),
            "state": RegionState.READY,
        }
        values.update(fields)
        for key, value in values.items():
            header[key] = value
        os.pwrite(fd, header.tobytes(), 0)
    finally:
        os.close(fd)


def test_other_layout_version_and_bad_magic_are_refused() -> None:
    url = unique_shm_url()
    write_fake_region(url, version=99)
    try:
        with pytest.raises(VersionMismatchError) as info:
            api.connect(url, timeout=2)
        assert "version" in str(info.value) and "99" in str(info.value)
    finally:
        remove(url)
    write_fake_region(url, magic=0x12345678)
    try:
        with pytest.raises(RegionMismatchError) as minfo:
            api.connect(url, timeout=2)
        assert "magic" in str(minfo.value) and "0x50414354" in str(minfo.value)
    finally:
        remove(url)


def test_connect_without_server_is_connect_error() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectError):
        api.connect(unique_shm_url(), timeout=0.3)
    assert time.monotonic() - started < 2.0


# -- dead and silent peers ---------------------------------------------------------------------


def test_server_killed_during_step_is_peer_gone_within_1s() -> None:
    proc = ServerProcess(unique_shm_url(1), env="echo")
    client = api.connect(proc.url, timeout=10)  # the 10 s timeout is not what ends the wait
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
    os.kill(proc.proc.pid, signal.SIGKILL)  # not reaped yet: a zombie counts as dead
    killed = time.monotonic()
    assert finished.wait(5)
    assert time.monotonic() - killed < 1.0
    assert len(errors) == 1 and isinstance(errors[0], PeerGoneError)
    client.close()
    proc.kill()
    # the dead server's segment is stale: --list-shm says so and --cleanup-shm removes it
    listed = json.loads(serve_cli("--list-shm", "--json").stdout)
    mine = [r for r in listed if r["path"] == segment_path(proc.url)]
    assert len(mine) == 1 and mine[0]["stale"] and not mine[0]["owner_alive"]
    cleaned = serve_cli("--cleanup-shm")
    assert cleaned.returncode == 0 and segment_path(proc.url) in cleaned.stdout
    assert not os.path.exists(segment_path(proc.url))


CLIENT_SCRIPT = """
import sys, transport.api as api
client = api.connect(sys.argv[1], timeout=5)
client.reset()
client.step([1] * client.num_envs)
print("attached", flush=True)
while True:
    client.step([2] * client.num_envs)
"""


def test_killed_client_lease_is_reclaimed_and_server_keeps_serving(server: ServerProcess) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, server.url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "attached"
        with pytest.raises(ConnectError) as info:  # one client per region at a time
            api.connect(server.url, timeout=1)
        assert f"client pid {child.pid}" in str(info.value)
        os.kill(child.pid, signal.SIGKILL)  # mid-step, most likely
        child.wait(5)
        with api.connect(server.url, timeout=5) as client:  # waits for the server to reclaim
            result = client.reset()
            assert result.life.tolist() == [0] * N  # fresh envs for the new lease
            assert client.step([6] * N).observation[:, 0].tolist() == [6.0] * N
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with api.connect(server.url, timeout=5) as client:  # a closed client frees the lease too
        client.reset()


# -- lifecycle -----------------------------------------------------------------------------------


def test_second_server_on_a_live_name_fails_clearly(server1: ServerProcess) -> None:
    second = serve_cli(server1.url)
    assert second.returncode == 1
    assert "in use by a live server" in second.stderr
    with api.connect(server1.url, timeout=5) as client:
        assert client.health()


def test_stale_region_is_replaced_on_start() -> None:
    url = unique_shm_url(1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_fake_region(url, owner_pid=dead.pid, owner_start_time=1)
    listed = json.loads(serve_cli("--list-shm", "--json").stdout)
    assert [r["stale"] for r in listed if r["path"] == segment_path(url)] == [True]
    with ServerProcess(url, env="echo") as proc:
        with api.connect(proc.url, timeout=5) as client:
            client.reset()
            assert client.step(3).observation[0] == 3.0


def test_client_sees_clean_shutdown_as_peer_gone() -> None:
    proc = ServerProcess(unique_shm_url(1), env="echo")
    client = api.connect(proc.url, timeout=5)
    client.reset()
    proc.terminate()
    proc.kill()
    with pytest.raises(PeerGoneError):
        client.step(1)
    client.close()


def test_too_many_envs_are_refused_at_start() -> None:
    url = unique_shm_url(10**9)  # 5 TB of slots: over MAX_NUM_ENVS, refused before /dev/shm
    result = serve_cli(url)
    assert result.returncode == 2
    assert "--num-envs must be 1..65536, not 1000000000" in result.stderr
    assert not os.path.exists(segment_path(url))


def test_no_room_in_dev_shm_is_an_error_at_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    import transport.backends.shm.server as shm_server
    from transport.envs.echo import EchoEnv

    url = unique_shm_url(4)
    monkeypatch.setattr(shm_server, "_free_shm_bytes", lambda: 4096)  # a nearly full /dev/shm
    server = api.Server(EchoEnv, url, num_envs=4)
    with pytest.raises(ConnectError, match="--shm-size") as caught:
        server.start()
    assert "/dev/shm has 4096 bytes free" in str(caught.value)
    assert not os.path.exists(segment_path(url))


def test_bad_urls() -> None:
    for url in ("shm://", "shm://a/b", "shm://x?num_envs=0", "shm://x?bogus=1"):
        with pytest.raises(ConnectError):
            api.connect(url, timeout=0.1)


# -- traces: the same pac games over shm as over unix ------------------------------------------

GAMES = 100
MAX_STEPS = 2000


def play(url: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    record = pac_env.StepResult.zeros()
    names = record.dtype.names or ()
    steps = 0

    def add(result: Any) -> None:
        for name in names:  # the StepResult bytes, whatever the transport's view layout
            record[name] = result[name]
        digest.update(record.tobytes())

    with api.connect(url, timeout=10) as client:
        for game in range(GAMES):
            policy = random.Random(game)
            result = client.reset(seed=game)
            add(result)
            for _ in range(MAX_STEPS):
                legal = np.flatnonzero(result.action_mask).tolist()
                result = client.step(policy.choice(legal))
                add(result)
                steps += 1
                if result.done:
                    break
            else:
                pytest.fail(f"game {game} did not end within {MAX_STEPS} steps")
    return digest.hexdigest(), steps


def test_pac_traces_identical_over_shm_and_unix() -> None:
    traces = {}
    for backend, url in (("unix", unique_url("unix")), ("shm", unique_shm_url(1))):
        with ServerProcess(url, env="pac", lang="python") as proc:
            traces[backend] = play(proc.url)
    assert traces["unix"][1] > GAMES
    assert traces["shm"] == traces["unix"]


def test_layout_constants_match_the_schema() -> None:
    assert pac_shm.ControlBlock.size == CONTROL_SIZE == 64
    assert pac_shm.Slot.size == SLOT_SIZE == 5120
    fields = {f.name: f.offset for f in pac_shm.Slot.ir.fields}
    assert fields["observation"] == 32 and fields["action_mask"] == 2480
    assert fields["reward"] == 16 and fields["actions_this_turn"] == 2572


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("lang", ["python", "node"])
def test_an_idle_spin_server_sleeps(lang: str) -> None:
    """wait=spin spins before each request, not forever: idle, the server sleeps in the kernel."""
    with ServerProcess(unique_shm_url(1) + "&wait=spin", lang=lang) as proc:
        with api.connect(proc.url, timeout=5) as client:
            client.reset()
            client.step(1)
            time.sleep(0.5)  # past the spin budget and the first idle slice
            before = cpu_seconds(proc.proc.pid)
            time.sleep(2.0)
            used = cpu_seconds(proc.proc.pid) - before
            assert used < 0.5, f"an idle {lang} server used {used:.2f} s of CPU in 2 s"
            assert client.step(2).observation[0] == 2  # and wakes for the next request
