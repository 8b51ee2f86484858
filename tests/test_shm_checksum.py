"""Issue 17 item 8: the optional per-slot checksum of shm:// (``?checksum=crc32`` on the server
URL). The server stamps a CRC-32 of each slot's result bytes before it publishes; a client in
either language checks it after its wait, so result bytes changed by another process after the
publish (here: a forged response written while the server is stopped) are a ProtocolError, not
data. A client that asks for checksums refuses a server that does not write them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import transport.api as api
from transport import native
from transport.backends.shm.region import CONTROL_SIZE, ShmLayout, parse_url
from transport.client import default_schema
from transport.errors import ConnectError

from .servers import ROOT, ServerProcess, require_lang

PY_CLIENT = textwrap.dedent(
    """
    import sys
    import transport.api as api
    client = api.connect(sys.argv[1], timeout=20)
    client.reset(seed=1)
    client.step(1)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        client.step(2)
        print("no error", flush=True)
    except Exception as exc:
        print(type(exc).__name__, exc, flush=True)
    """
)

NODE_CLIENT = textwrap.dedent(
    """
    const { connect } = require(process.argv[1]);
    (async () => {
      const client = await connect(process.argv[2], { timeoutMs: 20000 });
      await client.reset(1);
      await client.step(1);
      console.log("ready");
      process.stdin.once("data", async () => {
        try {
          await client.step(2);
          console.log("no error");
        } catch (error) {
          console.log(error.constructor.name, error.message);
        }
        process.exit(0);
      });
    })();
    """
)


def client_process(lang: str, url: str) -> subprocess.Popen[str]:
    if lang == "python":
        argv = [sys.executable, "-c", PY_CLIENT, url]
    else:
        argv = ["node", "-e", NODE_CLIENT, str(ROOT / "node_bridge" / "dist" / "index.js"), url]
    return subprocess.Popen(
        argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def wait_stopped(pid: int) -> None:
    """Until every thread of ``pid`` shows as stopped (state T): the forged response must be
    the only answer the client's next request can get (a stop is taken by each thread when it
    next runs in the kernel; on a loaded machine that is not at once)."""
    deadline = time.monotonic() + 10
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as fh:
                    states.append(fh.read().rpartition(")")[2].split()[0])
            except FileNotFoundError:
                continue
        if states and all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < deadline, f"server {pid} did not stop: {states}"
        time.sleep(0.002)


def forge_response(path: str) -> None:
    """What a scribbling co-tenant does while the server is stopped: answer slot 0's pending
    request itself, with one result byte changed."""
    layout = ShmLayout.of(default_schema())
    slot = CONTROL_SIZE
    request_at = slot + layout.slot_fields["sem_action_ready"].offset
    response_at = slot + layout.slot_fields["sem_result_ready"].offset
    fd = os.open(path, os.O_RDWR)
    try:
        import mmap

        with mmap.mmap(fd, 0) as region:
            words = np.ndarray((1,), dtype="<u4", buffer=region, offset=response_at)
            requests = np.ndarray((1,), dtype="<u4", buffer=region, offset=request_at)
            deadline = time.monotonic() + 20
            while (requests[0] & native.SEQ_MASK) == (words[0] & native.SEQ_MASK):
                assert time.monotonic() < deadline, "the client never sent its request"
                time.sleep(0.005)
            lo, _ = layout.result_span
            region[slot + lo] ^= 0xFF  # the first result byte, scribbled
            seq = int(requests[0]) & native.SEQ_MASK
            del words, requests
            response = native.word(region, response_at)
            native.store_release(response, seq)
            native.futex_wake(response)
    finally:
        os.close(fd)


@pytest.mark.parametrize("server_lang", ["python", "node"])
@pytest.mark.parametrize("client_lang", ["python", "node"])
def test_a_forged_result_is_caught_by_the_checksum(server_lang: str, client_lang: str) -> None:
    require_lang(server_lang)
    require_lang(client_lang)
    name = f"test-{uuid.uuid4().hex[:12]}"
    path = parse_url(f"shm://{name}").path
    server = ServerProcess(f"shm://{name}?checksum=crc32", lang=server_lang)
    client = client_process(client_lang, f"shm://{name}")
    assert client.stdin is not None and client.stdout is not None
    try:
        assert client.stdout.readline().strip() == "ready"  # honest steps pass the check
        os.kill(server.proc.pid, signal.SIGSTOP)
        wait_stopped(server.proc.pid)
        client.stdin.write("\n")
        client.stdin.flush()
        forge_response(path)
        line = client.stdout.readline()
        assert line.startswith("ProtocolError"), line
        assert "does not match the checksum its server wrote" in line, line
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        client.kill()
        client.wait()
        try:
            server.terminate()  # SIGTERM: the server removes its region
        finally:
            server.kill()
            if os.path.exists(path):
                native.shm_unlink(parse_url(f"shm://{name}").segment)


@pytest.mark.parametrize("server_lang", ["python", "node"])
def test_checksums_are_advertised_and_asked_for(server_lang: str) -> None:
    require_lang(server_lang)
    name = f"test-{uuid.uuid4().hex[:12]}"
    with ServerProcess(f"shm://{name}?checksum=crc32", lang=server_lang, num_envs=3) as server:
        with api.connect(f"shm://{name}?checksum=crc32", timeout=10) as client:
            assert client.server_info["checksum"] == "crc32"
            client.reset(seed=3)
            for _ in range(20):
                client.step([0, 1, 2])
            client.observe()  # slot 0's info area holds env info until the lease ends
    with ServerProcess(f"shm://{name}", lang=server_lang) as server:
        with pytest.raises(ConnectError, match=r"does not write checksums: start it with"):
            api.connect(f"shm://{name}?checksum=crc32", timeout=10)
        with api.connect(server.url, timeout=10) as client:
            assert "checksum" not in client.server_info


def test_an_unknown_checksum_is_a_bad_url() -> None:
    with pytest.raises(ConnectError, match="unknown checksum 'md5'"):
        parse_url("shm://x?checksum=md5")
