"""zmq+ipc:// and zmq+tcp:// with the Node server (`transport-serve ... --lang node`): Node only.

Everything both servers share (round trips, batches, bad input, dead and silent servers, ipc
socket files, CURVE, ...) runs against Python and Node in tests/test_zmq_backend.py, whose
``lang`` fixture skips the Node cases when the Node server is not built. Left here: the 100-game
pac trace of the Node server over zmq+ipc and zmq+tcp, compared byte for byte with the Python
server over unix://.
"""

from __future__ import annotations

import pytest

from .test_zmq_backend import assert_pac_traces_match_unix


@pytest.mark.slow
def test_pac_traces_identical_node_zmq_and_python_unix() -> None:
    assert_pac_traces_match_unix("node")
