"""What the channels do with /dev/shm entries named like their segments that are not theirs
(docs/channels.md "Segments"): FIFOs, directories, foreign, empty and text files, another user's
unreadable segment. ``python -m transport.channels --list/--cleanup`` never hang and never remove
them; opening or creating a ring, board or run control on one is a typed error at once, in
Python and in Node. Everything runs inside ``unshare -m`` with a private tmpfs on /dev/shm
(skipped where that is not permitted); real processes only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .private_shm import as_nobody, in_private_shm, private_shm

ROOT = Path(__file__).resolve().parents[1]
NODE_DIST = ROOT / "node_bridge" / "dist"


node = pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_DIST / "channels" / "segment.js").exists(),
    reason="node or node_bridge/dist missing",
)


# the entries that are not channel segments, each a minute old; and a dead channel segment of
# ours (the magic, a RING kind and a dead owner pid: 999999 > pid_max here)
_FOREIGN = """
    mkfifo /dev/shm/transport-ring-fifo
    mkdir /dev/shm/transport-board-dir
    head -c 4096 /dev/urandom > /dev/shm/transport-ring-rand
    : > /dev/shm/transport-control-empty
    echo "some text that is not a channel segment at all, longer than sixty-four bytes..." \\
        > /dev/shm/transport-board-text
    "$PY" -c "import struct,sys; d=bytearray(4096);
struct.pack_into('<IIII', d, 0, 0x48435054, 1, 1, 1); struct.pack_into('<I', d, 24, 999999);
open(sys.argv[1], 'wb').write(d)" /dev/shm/transport-ring-dead
    touch -d '1 minute ago' /dev/shm/transport-*
"""
_NOT_OURS = ("ring-fifo", "board-dir", "ring-rand", "control-empty", "board-text")

# open and create each entry through the public classes; one JSON line: name -> [op, type, text]
_PY_OPEN = r"""
import json, sys, time
from transport.channels import PolicyBoard, Ring, RunControl
from transport.generated import pac_env
rec = pac_env.SCHEMA["StepResult"]
ops = {
    "ring": (lambda n: Ring.open(n, rec, timeout=5), lambda n: Ring.create(n, rec, 4)),
    "board": (lambda n: PolicyBoard.open(n, timeout=5), None),
    "control": (lambda n: RunControl.open(n, timeout=5), lambda n: RunControl.create(n)),
}
out = {}
for full in sys.argv[1:]:
    kind, name = full.split("-", 1)
    for op, fn in zip(("open", "create"), ops[kind]):
        if fn is None:
            continue
        t = time.monotonic()
        try:
            fn(name).close()
            out[f"{full} {op}"] = ["ok", "", 0]
        except Exception as exc:
            out[f"{full} {op}"] = [type(exc).__name__, str(exc), time.monotonic() - t]
print(json.dumps(out))
"""

_NODE_OPEN = r"""
const { Segment } = require(process.env.DIST + "/channels/segment.js");
const out = {};
for (const full of process.argv.slice(1)) {
  const [kind, ...rest] = full.split("-");
  const name = rest.join("-");
  const ops = {
    open: () => Segment.open(kind, name, null, 5000),
    create: () => Segment.create(kind, name, 4096, 0n, () => {}),
  };
  for (const [op, fn] of Object.entries(ops)) {
    const t = performance.now();
    try {
      fn().close();
      out[`${full} ${op}`] = ["ok", "", 0];
    } catch (e) {
      const took = (performance.now() - t) / 1000;
      out[`${full} ${op}`] = [e.constructor.name, String(e.message), took];
    }
  }
}
console.log(JSON.stringify(out));
"""

_WORDS = {
    "ring-fifo": "/dev/shm/transport-ring-fifo is a FIFO, not a shared-memory segment: remove it "
    "if nothing uses it",
    "board-dir": "/dev/shm/transport-board-dir is a directory, not a shared-memory segment: "
    "remove it if nothing uses it",
    "ring-rand": "/dev/shm/transport-ring-rand exists and is not a channel segment: remove it if "
    "nothing uses it",
    "control-empty": "/dev/shm/transport-control-empty exists and is not a channel segment: "
    "remove it if nothing uses it",
    "board-text": "/dev/shm/transport-board-text exists and is not a channel segment: remove it "
    "if nothing uses it",
}


@private_shm
def test_list_and_cleanup_never_hang_and_remove_only_dead_channel_segments() -> None:
    """--list and --cleanup on a FIFO, a directory, a random, an empty and a text file named
    like channel segments: no hang (a FIFO blocked the open), no traceback (IsADirectoryError),
    each listed as foreign, none removed (an empty old file was "stale" and unlinked); the dead
    ring of ours is removed."""
    found = in_private_shm(
        'cd "$ROOT"\n'
        + _FOREIGN
        + """
        LIST=$(timeout 20 "$PY" -m transport.channels --list --json 2>&1)
        LIST_RC=$?
        TEXT=$(timeout 20 "$PY" -m transport.channels --list 2>&1)
        CLEAN=$(timeout 20 "$PY" -m transport.channels --cleanup 2>&1)
        CLEAN_RC=$?
        LEFT=$(ls /dev/shm | tr '\\n' ' ')
        "$PY" -c "import json,sys; print(json.dumps({'list': sys.argv[1], 'list_rc':
            int(sys.argv[2]), 'text': sys.argv[3], 'clean': sys.argv[4], 'clean_rc':
            int(sys.argv[5]), 'left': sys.argv[6].split()}))" \
            "$LIST" $LIST_RC "$TEXT" "$CLEAN" $CLEAN_RC "$LEFT"
        """
    )
    assert found["list_rc"] == 0, found
    listed = {
        os.path.basename(d["path"])[len("transport-") :]: d for d in json.loads(found["list"])
    }
    for name in _NOT_OURS:
        assert listed[name]["verdict"] == "foreign" and listed[name]["stale"] is False, listed
    assert listed["ring-fifo"]["note"] == "a FIFO" and listed["board-dir"]["note"] == "a directory"
    assert listed["ring-dead"]["verdict"] == "stale" and listed["ring-dead"]["kind"] == "ring"
    assert (
        "/dev/shm/transport-ring-fifo  foreign  (a FIFO, not a shared-memory segment)"
        in (found["text"])
    )
    assert found["clean_rc"] == 0 and "Traceback" not in found["clean"], found["clean"]
    assert "1 channel segment(s) removed" in found["clean"]
    assert sorted(found["left"]) == sorted(f"transport-{n}" for n in _NOT_OURS)


def _check_refusals(got: dict, *, board_create: bool) -> None:
    for name, words in _WORDS.items():
        kind = name.split("-")[0]
        for op in ("open", "create"):
            if op == "create" and kind == "board" and not board_create:
                continue
            typ, text, took = got[f"{name} {op}"]
            assert typ == "ChannelMismatchError" and text == words, (name, op, typ, text)
            assert took < 3, (name, op, took)  # at once: the open timeout is 5 s


@private_shm
def test_python_open_and_create_refuse_what_is_not_a_segment_at_once() -> None:
    """Ring/PolicyBoard/RunControl.open and create on a FIFO, a directory, a foreign, an empty
    and a text file: ChannelMismatchError at once with the listing's words (before: a directory
    raised IsADirectoryError, the others waited out the timeout, create removed the files)."""
    found = in_private_shm(
        'cd "$ROOT"\n'
        + _FOREIGN
        + f"""
        OUT=$(timeout 60 "$PY" -c '{_PY_OPEN}' {" ".join(_NOT_OURS)} 2>&1 | tail -n 1)
        LEFT=$(ls /dev/shm | tr '\\n' ' ')
        "$PY" -c "import json,sys; print(json.dumps({{'got': json.loads(sys.argv[1]),
            'left': sys.argv[2].split()}}))" "$OUT" "$LEFT"
        """
    )
    _check_refusals(found["got"], board_create=False)
    for name in _NOT_OURS:
        assert f"transport-{name}" in found["left"], found["left"]


@private_shm
@node
def test_node_open_and_create_refuse_what_is_not_a_segment_at_once() -> None:
    """The Node twin: Segment.open / Segment.create (under Ring, PolicyBoard, RunControl) on the
    same entries: ChannelMismatchError at once with segment.py's words, nothing removed (before:
    create hung on the FIFO and unlinked the foreign files, open waited out its timeout)."""
    found = in_private_shm(
        'cd "$ROOT"\n'
        + _FOREIGN
        + f"""
        OUT=$(DIST="$ROOT/node_bridge/dist" timeout 60 node -e '{_NODE_OPEN}' \
            {" ".join(_NOT_OURS)} 2>&1 | tail -n 1)
        LEFT=$(ls /dev/shm | tr '\\n' ' ')
        "$PY" -c "import json,sys; print(json.dumps({{'got': json.loads(sys.argv[1]),
            'left': sys.argv[2].split()}}))" "$OUT" "$LEFT"
        """
    )
    _check_refusals(found["got"], board_create=True)
    for name in _NOT_OURS:
        assert f"transport-{name}" in found["left"], found["left"]


@private_shm
@as_nobody
def test_other_users_channel_is_unreadable_never_stale_never_removed() -> None:
    """As another user: root's live 0600 ring is listed "unreadable (permission denied; owner
    uid 0)", never stale, left by --cleanup; opening it is a ChannelInUseError at once in both
    languages, creating one on its name says it cannot be read (before: a PermissionError
    traceback in Python, a 10 s wait in Node)."""
    node_part = (
        f"""
        NODE=$(DIST="$ROOT/node_bridge/dist" timeout 60 $NB node -e '{_NODE_OPEN}' ring-t38 \
            2>&1 | tail -n 1)"""
        if shutil.which("node") and (NODE_DIST / "channels" / "segment.js").exists()
        else "\nNODE='{}'"
    )
    found = in_private_shm(
        f"""
        cd "$ROOT"
        "$PY" -c "
import time
from transport.channels import Ring
from transport.generated import pac_env
ring = Ring.create('t38', pac_env.SCHEMA['StepResult'], 4)
print('up', flush=True)
time.sleep(60)
" > /tmp/p38ring.$$ &
        RING=$!
        for i in $(seq 100); do grep -q up /tmp/p38ring.$$ && break; sleep 0.1; done
        NB="setpriv --reuid=65534 --regid=65534 --clear-groups"
        LIST=$(timeout 20 $NB "$PY" -m transport.channels --list --json 2>&1)
        CLEAN=$(timeout 20 $NB "$PY" -m transport.channels --cleanup 2>&1)
        CLEAN_RC=$?
        PYOPEN=$(timeout 60 $NB "$PY" -c '{_PY_OPEN}' ring-t38 2>&1 | tail -n 1)
        {node_part}
        LEFT=$(ls /dev/shm | tr '\\n' ' ')
        kill $RING; wait $RING; rm -f /tmp/p38ring.$$
        "$PY" -c "import json,sys; print(json.dumps({{'list': sys.argv[1], 'clean': sys.argv[2],
            'clean_rc': int(sys.argv[3]), 'py': sys.argv[4], 'node': sys.argv[5],
            'left': sys.argv[6].split()}}))" "$LIST" "$CLEAN" $CLEAN_RC "$PYOPEN" "$NODE" "$LEFT"
        """
    )
    (entry,) = json.loads(found["list"])
    assert entry["verdict"] == "unreadable" and entry["stale"] is False, entry
    assert entry["note"] == "permission denied; owner uid 0"
    assert found["clean_rc"] == 0 and "Traceback" not in found["clean"], found["clean"]
    assert "transport-ring-t38" in found["left"]
    path = "/dev/shm/transport-ring-t38"
    for lang in ("py", "node"):
        got = json.loads(found[lang])
        if not got:
            continue
        typ, text, took = got["ring-t38 open"]
        assert typ == "ChannelInUseError", (lang, typ, text)
        assert text == f"{path} cannot be read (permission denied; owner uid 0)", (lang, text)
        assert took < 3, (lang, took)
        typ, text, _ = got["ring-t38 create"]
        assert typ == "ChannelInUseError", (lang, typ, text)
        assert text == f"{path} cannot be read (permission denied; owner uid 0); it is not replaced"
