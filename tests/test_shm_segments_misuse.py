"""What shm:// does with /dev/shm entries that are not its regions (docs/shm.md "Lifecycle"):
channels' segments, foreign files, FIFOs, directories, other users' regions, cut regions and
scribbled control blocks. Real processes only: ``transport-serve`` (Python and Node) and
clients of both languages.

Anything that runs ``--cleanup-shm`` or puts foreign files next to other segments runs inside
``unshare -m`` with a private tmpfs on /dev/shm (skipped where that is not permitted); the rest
uses names unique to the test and removes what it made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from transport.backends.shm.region import CB, SHM_DIR, parse_url
from transport.errors import ConnectError, RegionMismatchError

from .private_shm import in_private_shm, private_shm
from .servers import ServerProcess, require_lang

ROOT = Path(__file__).resolve().parents[1]
NODE_DIST = ROOT / "node_bridge" / "dist"
PY = sys.executable
BIN = Path(PY).parent


def _unique(tag: str) -> str:
    return f"p37{tag}{uuid.uuid4().hex[:8]}"


# a stale region of ours: a header with the magic and a dead owner pid (999999 > pid_max here)
_DEAD_REGION = (
    '"$PY" -c "import struct,sys; d=bytearray(4096); struct.pack_into(\'<I\', d, 0, 0x50414354); '
    "struct.pack_into('<I', d, 32, 999999); open(sys.argv[1], 'wb').write(d)\" "
)


@private_shm
def test_cleanup_and_list_leave_channels_and_foreign_entries() -> None:
    """--cleanup-shm removes a dead server's region and nothing else: not a live ring channel, a
    foreign file of any content, an empty file, a FIFO or a directory (each 1 minute old);
    --list-shm and --cleanup-shm never hang on the FIFO and call none of them live."""
    found = in_private_shm(
        """
        cd "$ROOT"
        "$PY" -c "
import time
from transport.channels import Ring
from transport.generated import pac_env
ring = Ring.create('t37', pac_env.SCHEMA['StepResult'], 4)
print('up', flush=True)
time.sleep(60)
" > /tmp/p37ring.$$ &
        RING=$!
        for i in $(seq 100); do grep -q up /tmp/p37ring.$$ && break; sleep 0.1; done
        head -c 4096 /dev/urandom > /dev/shm/transport-rand
        printf hello > /dev/shm/transport-five
        echo "some text that is not a region at all, longer than sixty-four bytes..." \
            > /dev/shm/transport-text
        : > /dev/shm/transport-empty
        mkfifo /dev/shm/transport-fifo
        mkdir /dev/shm/transport-dir
        """
        + _DEAD_REGION
        + """/dev/shm/transport-dead
        touch -d '1 minute ago' /dev/shm/transport-*
        LIST=$(timeout 20 transport-serve --list-shm --json)
        LIST_RC=$?
        CLEAN=$(timeout 20 transport-serve --cleanup-shm 2>&1)
        CLEAN_RC=$?
        LEFT=$(ls /dev/shm | tr '\\n' ' ')
        kill $RING; rm -f /tmp/p37ring.$$
        "$PY" -c "import json,sys; print(json.dumps({'list': json.loads(sys.argv[1]),
            'list_rc': int(sys.argv[2]), 'clean': sys.argv[3], 'clean_rc': int(sys.argv[4]),
            'left': sys.argv[5].split()}))" "$LIST" $LIST_RC "$CLEAN" $CLEAN_RC "$LEFT"
        """
    )
    assert found["list_rc"] == 0 and found["clean_rc"] == 0, found
    listed = {d["name"]: d for d in found["list"]}
    assert "ring-t37" not in listed  # a channel: python -m transport.channels --list
    for name in ("rand", "five", "text", "empty", "fifo", "dir"):
        assert listed[name]["verdict"] == "foreign", listed[name]
        assert listed[name]["stale"] is False
        assert listed[name]["num_envs"] == 0  # no garbage read from a foreign header
    assert listed["fifo"]["note"] == "a FIFO" and listed["dir"]["note"] == "a directory"
    assert listed["dead"]["verdict"] == "stale"
    assert "removed /dev/shm/transport-dead" in found["clean"]
    assert "Traceback" not in found["clean"]
    assert sorted(found["left"]) == sorted(
        ["transport-ring-t37"]
        + [f"transport-{n}" for n in ("rand", "five", "text", "empty", "fifo", "dir")]
    )


@private_shm
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another user (nobody)",
)
def test_other_users_region_is_unreadable_never_stale_and_cleanup_goes_on() -> None:
    """As another user: root's live 0600 region is "unreadable (permission denied; owner uid
    0)", never stale; a server on its name says permission denied; a stale region that user
    may not remove is reported and the cleanup goes on to remove that user's own."""
    found = in_private_shm(
        """
        cd "$ROOT"
        transport-serve shm://rootlive --env echo > /tmp/p37srv.$$ 2>&1 &
        SRV=$!
        for i in $(seq 200); do grep -q ready /tmp/p37srv.$$ && break; sleep 0.1; done
        """
        + _DEAD_REGION
        + """/dev/shm/transport-rootdead
        chmod 0644 /dev/shm/transport-rootdead
        NB="setpriv --reuid=65534 --regid=65534 --clear-groups"
        $NB """
        + _DEAD_REGION
        + """/dev/shm/transport-mydead
        LIST=$(timeout 20 $NB "$BIN/transport-serve" --list-shm --json)
        CLEAN=$(timeout 20 $NB "$BIN/transport-serve" --cleanup-shm 2>&1)
        CLEAN_RC=$?
        SERVE=$(timeout 20 $NB "$BIN/transport-serve" shm://rootlive --env echo 2>&1)
        SERVE_RC=$?
        LEFT=$(ls /dev/shm | tr '\\n' ' ')
        kill $SRV; wait $SRV; rm -f /tmp/p37srv.$$
        "$PY" -c "import json,sys; print(json.dumps({'list': json.loads(sys.argv[1]),
            'clean': sys.argv[2], 'clean_rc': int(sys.argv[3]), 'serve': sys.argv[4],
            'serve_rc': int(sys.argv[5]), 'left': sys.argv[6].split()}))" \
            "$LIST" "$CLEAN" $CLEAN_RC "$SERVE" $SERVE_RC "$LEFT"
        """.replace("$BIN", str(BIN))
    )
    listed = {d["name"]: d for d in found["list"]}
    assert listed["rootlive"]["verdict"] == "unreadable", listed
    assert listed["rootlive"]["note"] == "permission denied; owner uid 0"
    assert listed["rootlive"]["stale"] is False
    assert listed["rootdead"]["verdict"] == "stale" and listed["mydead"]["verdict"] == "stale"
    # exit 1: a stale segment could not be removed (it is named on stderr)
    assert found["clean_rc"] == 1 and "Traceback" not in found["clean"], found["clean"]
    assert "cannot remove /dev/shm/transport-rootdead" in found["clean"]
    assert "removed /dev/shm/transport-mydead" in found["clean"]
    assert "transport-rootlive" in found["left"] and "transport-rootdead" in found["left"]
    assert "transport-mydead" not in found["left"]
    assert found["serve_rc"] == 1, found["serve"]
    assert "permission denied" in found["serve"] and "live server" not in found["serve"]
    assert "Traceback" not in found["serve"]


# -- servers on a name that is not theirs (unique names in the real /dev/shm) ---------------------


def _langs() -> list[str]:
    return ["python", "node"]


def _serve_refused(url: str, lang: str) -> subprocess.CompletedProcess[str]:
    require_lang(lang)
    return subprocess.run(
        [PY, "-m", "transport.tools.serve_cli", url, "--env", "echo", "--lang", lang],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@pytest.mark.parametrize("lang", _langs())
@pytest.mark.parametrize("what", ["fifo", "dir", "foreign", "old_empty"])
def test_server_refuses_what_is_not_a_region(lang: str, what: str) -> None:
    name = _unique(what)
    path = f"{SHM_DIR}/transport-{name}"
    if what == "fifo":
        os.mkfifo(path, 0o600)
        words = f"{path} is a FIFO, not a shared-memory segment: remove it if nothing uses it"
    elif what == "dir":
        os.mkdir(path, 0o700)
        words = f"{path} is a directory, not a shared-memory segment: remove it if nothing uses it"
    else:
        with open(path, "wb") as fh:
            fh.write(os.urandom(4096) if what == "foreign" else b"")
        words = f"{path} exists and is not a transport region: remove it if nothing uses it"
    os.utime(path, (0, os.stat(path).st_mtime - 60), follow_symlinks=False)
    try:
        done = _serve_refused(f"shm://{name}", lang)
        assert done.returncode == 1, done
        assert words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "live server" not in done.stderr
        assert os.path.lexists(path)  # never removed
    finally:
        if os.path.isdir(path):
            os.rmdir(path)
        else:
            os.unlink(path)


@pytest.mark.parametrize("lang", _langs())
@pytest.mark.parametrize("name", ["ring-x", "board-x", "control-x"])
def test_channel_names_are_reserved(lang: str, name: str) -> None:
    done = _serve_refused(f"shm://{name}", lang)
    assert done.returncode != 0
    assert (
        "region names beginning ring-, board- or control- are reserved for channels" in done.stderr
    ), done.stderr
    with pytest.raises(ConnectError, match="reserved for channels"):
        parse_url(f"shm://{name}")


def test_name_text_says_the_first_character() -> None:
    with pytest.raises(ConnectError, match="the first a letter or a digit"):
        parse_url("shm://.hidden")


# -- clients on what is not a region ----------------------------------------------------------


def _node_connect(url: str, pinned: bool, timeout_ms: int = 1000) -> dict:
    require_lang("node")
    script = f"""
const {{ connect }} = require({json.dumps(str(NODE_DIST / "index.js"))});
const pac_env = require({json.dumps(str(NODE_DIST / "generated" / "pac_env.js"))});
(async () => {{
  const t = Date.now();
  try {{
    const c = await connect({json.dumps(url)}, {{ timeoutMs: {timeout_ms}
      {", schema: pac_env.SCHEMA" if pinned else ""} }});
    await c.close();
    console.log(JSON.stringify({{ ok: true }}));
  }} catch (e) {{
    console.log(JSON.stringify({{ error: e.constructor.name, message: String(e.message),
      ms: Date.now() - t }}));
  }}
}})();
"""
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("what", ["fifo", "dir"])
def test_clients_refuse_what_is_not_a_file(what: str) -> None:
    """Both clients, schema discovered or pinned: a ConnectError naming the path and what it is,
    at once (no wait for the timeout, no hang on the FIFO)."""
    name = _unique(what)
    path = f"{SHM_DIR}/transport-{name}"
    if what == "fifo":
        os.mkfifo(path, 0o600)
    else:
        os.mkdir(path, 0o700)
    words = f"{path} is {'a FIFO' if what == 'fifo' else 'a directory'}, not a shared-memory"
    try:
        from transport.api import connect
        from transport.generated import pac_env

        for schema in (None, pac_env.SCHEMA):
            with pytest.raises(ConnectError, match=words) as caught:
                connect(f"shm://{name}", schema, timeout=30)
            assert "is a server serving" not in str(caught.value)  # no server to start
        for pinned in (False, True):
            found = _node_connect(f"shm://{name}", pinned, timeout_ms=30_000)
            assert found.get("error") in ("ConnectError", "NotASegmentError"), found
            assert words in found["message"], found
            assert "is a server serving" not in found["message"], found
            assert found["ms"] < 5000, found  # not the 30 s timeout
    finally:
        if what == "dir":
            os.rmdir(path)
        else:
            os.unlink(path)


def test_node_refuses_a_doubled_question_mark() -> None:
    done = _serve_refused("shm://p37q??num_envs=2", "node")
    assert done.returncode != 0
    assert "unknown parameter(s) ?num_envs" in done.stderr, done.stderr


# -- cut and scribbled regions ------------------------------------------------------------------


@pytest.mark.parametrize("lang", _langs())
def test_a_cut_stale_region_is_stale_not_schemaless(lang: str) -> None:
    """A dead server's region cut to 1000 bytes: every client says it is stale (its server is
    gone), with the schema discovered or pinned, not "carries no schema" / a size mismatch."""
    name = _unique("cut")
    server = ServerProcess(f"shm://{name}", lang=lang)
    path = f"{SHM_DIR}/transport-{name}"
    try:
        with open(path, "rb") as fh:  # the server's own pid (the Node server: the node process)
            owner = int.from_bytes(fh.read(64)[CB["owner_pid"].offset :][:4], "little")
        os.kill(owner, signal.SIGKILL)
        server.kill()
        server.proc.wait(timeout=30)
        os.truncate(path, 1000)
        from transport.api import connect
        from transport.generated import pac_env

        for schema in (None, pac_env.SCHEMA):
            with pytest.raises(ConnectError, match=r"is stale: its server \(pid \d+\) is gone"):
                connect(f"shm://{name}", schema, timeout=5)
        for pinned in (False, True):
            found = _node_connect(f"shm://{name}", pinned)
            assert "is stale: its server" in found.get("message", ""), found
    finally:
        server.kill()
        if os.path.exists(path):
            os.unlink(path)


def test_a_region_saying_zero_envs_is_refused() -> None:
    """A copy of a live server's region whose control block says num_envs = 0."""
    name = _unique("src")
    fake = _unique("zero")
    server = ServerProcess(f"shm://{name}")
    fake_path = f"{SHM_DIR}/transport-{fake}"
    try:
        data = bytearray(open(f"{SHM_DIR}/transport-{name}", "rb").read())
        data[CB["num_envs"].offset : CB["num_envs"].offset + 4] = (0).to_bytes(4, "little")
        fd = os.open(fake_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.write(fd, bytes(data))
        os.close(fd)
        from transport.api import connect
        from transport.generated import pac_env

        for schema in (None, pac_env.SCHEMA):
            with pytest.raises(
                RegionMismatchError, match=r"num_envs: expected 1\.\.65536, found 0"
            ):
                connect(f"shm://{fake}", schema, timeout=5)
        for pinned in (False, True):
            found = _node_connect(f"shm://{fake}", pinned)
            assert found.get("error") == "RegionMismatchError", found
            assert "num_envs: expected 1..65536, found 0" in found["message"], found
    finally:
        server.terminate()
        if os.path.exists(fake_path):
            os.unlink(fake_path)


def test_a_cut_live_region_says_it_is_short() -> None:
    """A copy of a live server's region cut to 1000 bytes (its owner lives): discovery says the
    region is shorter than its header says, not "carries no schema"."""
    name = _unique("src")
    fake = _unique("short")
    server = ServerProcess(f"shm://{name}")
    fake_path = f"{SHM_DIR}/transport-{fake}"
    try:
        data = open(f"{SHM_DIR}/transport-{name}", "rb").read()[:1000]
        fd = os.open(fake_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.write(fd, data)
        os.close(fd)
        from transport.api import connect

        short = "the region is shorter than its header says"
        with pytest.raises(RegionMismatchError, match=short):
            connect(f"shm://{fake}", timeout=5)
        found = _node_connect(f"shm://{fake}", False)
        assert found.get("error") == "RegionMismatchError", found
        assert short in found["message"], found
    finally:
        server.terminate()
        if os.path.exists(fake_path):
            os.unlink(fake_path)


SLOW_ENV = """
import os, time
from transport.envs.echo import EchoEnv


class Slow(EchoEnv):
    def _slow(self, action):
        if int(action) == 7:
            open(os.path.join(os.path.dirname(__file__), "in-step"), "w").close()
            time.sleep(20)

    def step_into(self, action, out):
        self._slow(action)
        super().step_into(action, out)

    def step(self, action):
        self._slow(action)
        return super().step(action)
"""

STEP_CLIENT = """
import sys
import numpy as np
from transport.api import connect
client = connect(sys.argv[1], timeout=10)
client.reset()
client.step(np.array([7]))
"""


def test_a_dead_clients_lease_in_a_long_step_says_the_server_is_busy(tmp_path: Path) -> None:
    """A client killed while the server runs its 20 s step: the next client's lease wait ends
    saying the server is busy (it reclaims leases between requests), in both languages."""
    (tmp_path / "p37slow.py").write_text(SLOW_ENV)
    name = _unique("busy")
    extra = ["--schema", "pac_env"]
    server = ServerProcess(f"shm://{name}", env="p37slow:Slow", cwd=tmp_path, extra=extra)
    client = subprocess.Popen([PY, "-c", STEP_CLIENT, f"shm://{name}"], cwd=ROOT)
    try:
        marker = tmp_path / "in-step"
        for _ in range(200):
            if marker.exists():
                break
            time.sleep(0.05)
        assert marker.exists(), "the slow step did not start"
        client.kill()
        client.wait(timeout=30)
        from transport.api import connect

        busy = "the server is busy with a request of that client"
        with pytest.raises(ConnectError, match=busy):
            connect(f"shm://{name}", timeout=1)
        found = _node_connect(f"shm://{name}", False, 1000)
        assert busy in found.get("message", ""), found
    finally:
        client.kill()
        server.kill()
        path = f"{SHM_DIR}/transport-{name}"
        if os.path.exists(path):
            os.unlink(path)
