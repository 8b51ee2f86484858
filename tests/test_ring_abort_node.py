"""``Producer.abort`` across languages: a Node producer (node_bridge/dist/channels) gives its
reservation back and a Python consumer never sees the records, whether the reservation was
undone (nobody reserved after it) or skipped (another producer did: counted in ``lost``). The
Node-only tests are node_bridge/src/test/ring_abort.test.ts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.channels_util import unique, watchdog
from transport.channels import ChannelClosedError, Ring
from transport.generated import experience

DIST = Path(__file__).resolve().parents[1] / "node_bridge" / "dist"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (DIST / "channels" / "index.js").is_file(),
    reason="node or node_bridge/dist is missing (cd node_bridge && npm run build)",
)

# argv: ring name, "undo" or "skip". Node writes action 7 into the records it aborts.
SCRIPT = f"""
const {{ Ring }} = require({json.dumps(str(DIST / "channels" / "index.js"))});
const {{ experience }} = require({json.dumps(str(DIST / "generated" / "index.js"))});
const [name, mode] = process.argv.slice(1);
const codec = experience.TransitionCodec;
const zero = codec.decode(new Uint8Array(codec.size));
const ring = Ring.open(name, experience.SCHEMA, "Transition");
const put = (r, action) => {{
  for (let i = 0; i < r.count; i++) {{
    codec.writeInto({{ ...zero, action }}, ring.segment.bytes, r.offset + i * ring.recordSize);
  }}
}};
const a = ring.producer();
const out = {{}};
const r = a.reserve(2, 5000);
put(r, 7);
out.reserved = Number(r.first);
if (mode === "skip") {{
  const b = ring.producer();
  put(b.reserve(1, 5000), 9);
  out.other = Number(b.commit());
  b.close();
}}
a.abort(5000);
out.head = Number(ring.head);
put(a.reserve(1, 5000), 5);
out.next = Number(a.commit());
a.close();
ring.close();
console.log(JSON.stringify(out));
"""


def run_node(name: str, mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        ["node", "-e", SCRIPT, name, mode], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def actions(consumer: Any, expected: int) -> tuple[list[int], list[int]]:
    """(indices, actions) of the next ``expected`` records."""
    indices: list[int] = []
    got: list[int] = []
    while len(got) < expected:
        with consumer.take(8, timeout=5) as batch:
            indices += [int(i) for i in batch.indices]
            got += [int(a) for a in batch.field("action")]
    return indices, got


def test_a_node_producer_aborts_undone_and_python_never_sees_the_records() -> None:
    with watchdog(60), Ring.create(unique("abn"), experience.Transition, 8) as ring:
        consumer = ring.consumer()
        out = run_node(ring.name, "undo")
        assert out == {"reserved": 0, "head": 0, "next": 0}  # undone: the same index again
        assert actions(consumer, 1) == ([0], [5])
        assert ring.lost == 0 and ring.head == 1
        with pytest.raises(ChannelClosedError):  # nothing else: the end of the stream
            consumer.take(8, timeout=1)


def test_a_node_producer_aborts_skipped_and_python_counts_them_lost() -> None:
    with (
        watchdog(60),
        Ring.create(unique("abs"), experience.Transition, 8, multi_producer=True) as ring,
    ):
        consumer = ring.consumer()
        out = run_node(ring.name, "skip")
        assert out == {"reserved": 0, "other": 2, "head": 3, "next": 3}
        assert actions(consumer, 2) == ([2, 3], [9, 5])  # records 0, 1 skipped
        assert ring.lost == 2
        with pytest.raises(ChannelClosedError):
            consumer.take(8, timeout=1)
