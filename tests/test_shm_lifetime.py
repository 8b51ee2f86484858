"""Issue 22 items 2 and 5, the shm:// client: what results view outlives close(), and close()
always lets go of the lease.

Item 2: results are zero-copy views of the slots. Before the fix ``close()`` unmapped the region
under them, so reading a kept result (or stepping a closed client, which writes the actions into
the slots first) killed the process with SIGSEGV. The crash cases run in a child process and
must exit 0 printing the right values or a clean TransportError.

Item 5: a server that answers SHUTDOWN with a status made ``close()`` leak a private exception
and the lease, so every later connect of the process failed "in use by this process".
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import transport.api as api
from transport import native
from transport.backends.shm.channel import ShmChannel, open_channel
from transport.backends.shm.region import CB
from transport.errors import TransportError

from .servers import ROOT, ServerProcess

N = 3


def unique_shm_url(num_envs: int | None = None) -> str:
    url = f"shm://lifetime-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    return url + (f"?num_envs={num_envs}" if num_envs else "")


def run_child(script: str, url: str) -> dict[str, object]:
    """Run ``script`` (it gets ``URL``) in a fresh interpreter; its last line is JSON."""
    code = "import json, gc, sys\nURL = sys.argv[1]\n" + textwrap.dedent(script)
    proc = subprocess.run(
        [sys.executable, "-c", code, url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"the child died with exit code {proc.returncode} (-11/139: SIGSEGV)\n"
        f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
    )
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with ServerProcess(unique_shm_url(N), env="echo", num_envs=N) as proc:
        yield proc


@pytest.fixture
def server1() -> Iterator[ServerProcess]:
    with ServerProcess(unique_shm_url(1), env="echo") as proc:
        yield proc


# -- item 2: kept results outlive close() ------------------------------------------------------


def test_a_result_kept_after_close_reads_its_values(server1: ServerProcess) -> None:
    """The issue's reproduction: a result read after the ``with`` block (SIGSEGV before)."""
    out = run_child(
        """
        import transport.api as api
        with api.connect(URL, timeout=10) as c:
            r = c.reset()
            s = c.step(3)
            owned = s.copy()
        print(json.dumps({
            "obs": s.observation[:2].tolist(), "reward": float(s.reward), "life": int(s.life),
            "reset_obs0": float(r.observation[0]),
            "owned": owned.observation[:2].tolist(),
        }))
        """,
        server1.url,
    )
    # echo: a step's result is the step's own (the reset result is the same view, refreshed)
    assert out == {
        "obs": [3.0, 1.0],
        "reward": 0.75,
        "life": 1,
        "reset_obs0": 3.0,
        "owned": [3.0, 1.0],
    }


def test_batched_results_survive_close_the_client_and_the_server(server: ServerProcess) -> None:
    """N-env views (strided across slots) read after close, after the client is collected and
    after the server is gone; the kept views no longer map the segment, and the private copy
    they read goes away with the last of them."""
    script = textwrap.dedent(
        """
        import json, gc, sys, os
        import transport.api as api
        URL = sys.argv[1]

        def mapped(what):
            with open("/proc/self/maps") as fh:
                return sum(what in line for line in fh)

        def holds(address):
            with open("/proc/self/maps") as fh:
                for line in fh:
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    if lo <= address < hi:
                        return True
            return False

        segment = "transport-" + URL.partition("://")[2].partition("?")[0]
        c = api.connect(URL, timeout=10)
        c.reset(seed=5)
        s = c.step([1, 2, 3])
        obs, reward = s.observation, s.reward
        address = obs.__array_interface__["data"][0]
        before = mapped(segment)
        c.close()
        after_close = mapped(segment)
        first = obs[:, 0].tolist()
        del c, s
        gc.collect()
        collected = obs[:, 0].tolist() + reward.tolist()
        obs[0, 0] = 42.0
        print("closed", flush=True)
        sys.stdin.readline()  # the parent stopped the server meanwhile
        gone = obs[:, :2].tolist()
        kept = holds(address)
        del obs, reward
        gc.collect()
        print(json.dumps({
            "before": before, "after_close": after_close, "first": first,
            "collected": collected, "gone": gone, "kept": kept, "freed": not holds(address),
        }))
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, server.url],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    line = child.stdout.readline()
    if line.strip() == "closed":
        server.terminate()
        child.stdin.write("go\n")
        child.stdin.flush()
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, (
        f"the child died with exit code {child.returncode} (-11: SIGSEGV)\n{line}{stdout}\n"
        f"{stderr[-4000:]}"
    )
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["before"] >= 1  # the client mapped the segment ...
    assert out["after_close"] == 0  # ... and holds none of it after close, views or not
    assert out["first"] == [1.0, 2.0, 3.0]
    assert out["collected"] == [1.0, 2.0, 3.0, 0.25, 0.5, 0.75]
    assert out["gone"] == [[42.0, 1.0], [2.0, 1.0], [3.0, 1.0]]
    assert out["kept"] is True and out["freed"] is True  # unmapped with the last view


def test_a_closed_client_raises_a_typed_error(server1: ServerProcess) -> None:
    """Every call on a closed client is a TransportError; ``step`` writes its action before it
    looks, which wrote into the unmapped slots (SIGSEGV) before the fix."""
    out = run_child(
        """
        import transport.api as api
        from transport.errors import TransportError
        c = api.connect(URL, timeout=10)
        c.reset()
        c.close()
        errors = {}
        for name, call in {
            "step": lambda: c.step(1),
            "reset": lambda: c.reset(),
            "reset_seed": lambda: c.reset(seed=3),
            "health": lambda: c.health(),
            "spaces": lambda: c.spaces(),
            "observe": lambda: c.observe(),
            "step_multi": lambda: c.step_multi([0] * 8),
        }.items():
            try:
                call()
                errors[name] = "no error"
            except TransportError as exc:
                errors[name] = "TransportError"
            except Exception as exc:
                errors[name] = type(exc).__name__
        c.close()  # twice: nothing
        print(json.dumps(errors))
        """,
        server1.url,
    )
    assert set(out.values()) == {"TransportError"}, out


def test_a_closed_channel_raises_a_typed_error(server1: ServerProcess) -> None:
    """The channel itself (what Client and connect_many use) refuses after close."""
    client = api.connect(server1.url, timeout=10)
    client.reset()
    channel = client.channel
    assert isinstance(channel, ShmChannel)
    client.close()
    with pytest.raises(TransportError):
        channel.request(client.ids.RESET_REQ, b"")
    with pytest.raises(TransportError):
        channel.result_records(memoryview(b""), client._result, None, False)
    channel._late = True  # as after a timeout: settle must not wait on the unmapped region
    with pytest.raises(TransportError):
        channel.settle()


def test_close_without_kept_views_unmaps_at_once(server1: ServerProcess) -> None:
    """No view left: nothing is copied, the mapping is gone when close() returns."""
    channel = open_channel(server1.url, timeout=10)
    address = int(native.ffi.cast("uintptr_t", channel.region.base))
    channel.close()
    assert not maps_address(address)


def test_a_view_of_the_region_keeps_its_memory(server1: ServerProcess) -> None:
    """Views the client never made (``np.frombuffer(region.map)``) keep their memory too."""
    client = api.connect(server1.url, timeout=10)
    client.reset()
    result = client.step(9)
    channel = client.channel
    assert isinstance(channel, ShmChannel)
    whole = np.frombuffer(channel.region.map, dtype=np.uint8)
    del channel
    start = result.observation.__array_interface__["data"][0] - whole.ctypes.data
    observation = result.observation.copy()
    del result
    client.close()
    del client
    gc.collect()
    kept = whole[start : start + observation.nbytes].view(np.float32)
    np.testing.assert_array_equal(kept, observation)
    assert kept[0] == 9.0


def maps_address(address: int) -> bool:
    with open("/proc/self/maps") as fh:
        spans = [line.split()[0].split("-") for line in fh]
    return any(int(lo, 16) <= address < int(hi, 16) for lo, hi in spans)


def test_shared_mapping_lives_as_long_as_its_last_view() -> None:
    """native.SharedMapping, the owner of every region mapping: close() with a view left keeps
    a private copy (writes stay private, a later truncation cannot fault it), unmapped when the
    last view dies; close() without one unmaps at once."""
    fd = os.memfd_create("shm-lifetime")
    try:
        os.ftruncate(fd, 3 * 4096)
        mapping = native.SharedMapping(fd, 3 * 4096)
        view = np.ndarray((3 * 1024,), dtype="<u4", buffer=mapping.buffer)
        view[:] = np.arange(view.size)
        address = view.ctypes.data
        tail = view[2048:]  # a view of a view holds the mapping too
        del view
        assert mapping.close() is False  # views left: privatized, not unmapped
        tail[0] = 7  # private now: the segment keeps its value
        assert os.pread(fd, 4, 2048 * 4) == (2048).to_bytes(4, "little")
        os.ftruncate(fd, 0)  # another process's truncation: no SIGBUS for private pages
        assert tail[1] == 2049 and tail[-1] == 3 * 1024 - 1
        assert maps_address(address)
        del tail
        gc.collect()
        assert not maps_address(address)  # gone with the last view
        os.ftruncate(fd, 4096)
        bare = native.SharedMapping(fd, 4096)
        address = int(native.ffi.cast("uintptr_t", native.address(bare.buffer)))
        assert bare.close() is True and not maps_address(address)
    finally:
        os.close(fd)


def test_a_region_truncated_by_another_process_closes_without_a_fault() -> None:
    """close() with views left copies the region: past a truncation's end the guard turns the
    fault into zeros, so kept views read their first page and zeros (SIGSEGV before: unmapped)."""
    url = unique_shm_url()
    try:
        out = run_child(
            """
            import os
            from transport import native
            from transport.backends.shm.region import Region, ShmLayout, parse_url
            from transport.generated import pac_env
            shm = parse_url(URL)
            layout = ShmLayout.of(pac_env.SCHEMA)
            size = layout.region_size(2)
            fd = native.shm_create(shm.segment, size)
            try:
                region = Region(shm.segment, fd, size, layout, owner=True, slots=2)
                os.ftruncate(fd, 100)  # another process's truncation: the pages past it are gone
            finally:
                os.close(fd)
            try:
                words = region.strided("status")  # slot 0 in the first page, slot 1 past it
                words[0] = 9
                region.close()
                print(json.dumps({"first": int(words[0]), "second": int(words[1])}))
            finally:
                native.shm_unlink(shm.segment)
            """,
            url,
        )
    finally:
        try:
            native.shm_unlink("/transport-" + url.partition("://")[2])
        except FileNotFoundError:
            pass
    assert out == {"first": 9, "second": 0}


# -- item 5: close() always lets go ----------------------------------------------------------


@pytest.fixture
def refusing_peer() -> Iterator[str]:
    url = unique_shm_url()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.shm_refusing_peer", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == f"ready {url}", (line, proc.stderr.read() if proc.stderr else "")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def client_pid_of(url: str) -> int:
    path = "/dev/shm/transport-" + url.partition("://")[2]
    with open(path, "rb") as fh:
        fh.seek(CB["client_pid"].offset)
        return int.from_bytes(fh.read(4), "little")


def test_close_meeting_a_refused_shutdown_releases_the_lease(refusing_peer: str) -> None:
    url = refusing_peer
    for _ in range(3):  # every connect after the first found "in use by this process" before
        client = api.connect(url, timeout=10)
        assert client_pid_of(url) == os.getpid()
        client.reset()
        try:
            client.close()  # SHUTDOWN answered INTERNAL: before, a private _Refused escaped
        except TransportError:
            pass  # at most this
        assert isinstance(client.channel, ShmChannel) and client.channel._closed
        assert client_pid_of(url) == 0
