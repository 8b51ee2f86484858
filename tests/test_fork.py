"""A process forked (``os.fork``) from one that serves or holds a client.

Before: a child that exited normally ran the parent's atexit handlers and finalizers in its own
copy: ``Server.close`` removed the parent's socket file or shm region (new clients could not
connect), a worker pool's copy stored CLOSED in the parent's shared memory, and
multiprocessing's exit handler sent SIGTERM to the parent's worker processes (its set of
children came with the fork). A child that stepped the parent's client wrote into the parent's
session: over shm the parent's next step returned the child's results; over zmq the child hung.
Now the child's copies of servers and pools do nothing at its exit, and the parent's clients are
closed in the child with a message that says to connect its own. Each case runs in a fresh
Python (the fork must not copy pytest), with real servers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .servers import ROOT

SCRIPT = textwrap.dedent(
    """
    import os, sys, uuid
    import numpy as np
    import transport
    from transport.envs.echo import EchoEnv
    from transport.generated import pac_env

    scheme, workers, case = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tag = f"fork-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    url = {
        "shm": f"shm://{tag}?num_envs=2",
        "unix": f"unix:///tmp/{tag}.sock",
        "zmq+ipc": f"zmq+ipc:///tmp/{tag}.sock",
    }[scheme]
    if __name__ == "__main__":
        server = transport.Server(
            EchoEnv, url, schema=pac_env.SCHEMA, num_envs=2, workers=workers
        ).start()
        client = transport.connect(server.bound_url, timeout=10)
        client.reset(seed=1)
        client.step(np.array([1, 1]))
        pid = os.fork()
        if pid == 0:
            if case == "step":
                try:
                    client.step(np.array([5, 5]))
                    print("child stepped", flush=True)
                except transport.TransportError as exc:
                    print("child refused:", exc, flush=True)
                os._exit(0)
            sys.exit(0)  # a normal exit: atexit handlers and finalizers run in the child
        os.waitpid(pid, 0)
        view = client.step(np.array([2, 2]), copy=True)
        print("parent steps its own:", bool(np.all(view.observation[:, 0] == 2)), flush=True)
        client.close()
        with transport.connect(server.bound_url, timeout=10) as again:
            again.reset(seed=1)
            again.step(np.array([3, 3]))
        print("a new client connects", flush=True)
        server.close()
    """
)


def _run(scheme: str, workers: int, case: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, scheme, str(workers), case],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize(("scheme", "workers"), [("unix", 0), ("shm", 0), ("shm", 2)])
def test_a_child_that_exits_leaves_the_parents_server_serving(scheme: str, workers: int) -> None:
    out = _run(scheme, workers, "exit")
    assert "parent steps its own: True" in out and "a new client connects" in out, out


@pytest.mark.parametrize("scheme", ["shm", "zmq+ipc", "unix"])
def test_a_child_is_refused_the_parents_client(scheme: str) -> None:
    out = _run(scheme, 0, "step")
    assert "child refused:" in out and "connect a client of its own here" in out, out
    assert "parent steps its own: True" in out, out


def test_a_client_cannot_be_pickled_and_says_what_to_do(tmp_path: Path) -> None:
    """Sending a client to another process (multiprocessing spawn, Ray) used to fail deep in
    pickle ("cannot pickle '_thread.lock' object"); it now names the URL and what to do."""
    import pickle

    import transport
    from transport.envs.echo import EchoEnv
    from transport.generated import pac_env

    url = f"unix://{tmp_path}/pickle.sock"
    with transport.Server(EchoEnv, url, schema=pac_env.SCHEMA).start() as server:
        with transport.connect(server.bound_url, timeout=10) as client:
            with pytest.raises(TypeError, match=r"call transport\.connect\(url\) there"):
                pickle.dumps(client)
            client.reset(seed=1)  # untouched


CHANNELS_SCRIPT = textwrap.dedent(
    """
    import os, sys, uuid
    import numpy as np
    from transport.channels import PolicyBoard, Ring
    from transport.generated import experience

    tag = f"fork-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with Ring.create(tag, experience.Transition, capacity=16) as ring, PolicyBoard.create(
        tag, {"w": np.zeros(4, np.float32)}
    ) as board:
        producer, consumer = ring.producer(), ring.consumer()
        producer.push(np.zeros(2, ring.record.dtype))
        batch = consumer.take(1, timeout=1)  # one record held by the consumer
        pid = os.fork()
        if pid == 0:
            producer.close()
            consumer.close()
            sys.exit(0)  # through both with blocks: the child's copies close
        os.waitpid(pid, 0)
        print("ring file:", os.path.exists(ring.segment.path), flush=True)
        print("board file:", os.path.exists(board.segment.path), flush=True)
        with Ring.open(tag, experience.Transition, timeout=1) as again:  # a new process's view
            print("opened again:", again.segment.header["state"] == ring.segment.header["state"])
        producer.push(np.ones(1, ring.record.dtype), timeout=1)
        print("taken:", len(consumer.take(4, timeout=1)), flush=True)
        print("published:", board.publish({"w": np.ones(4, np.float32)}), flush=True)
        version, arrays = board.read(timeout=1)
        print("read:", version, float(arrays["w"].sum()), flush=True)
    print("after close:", os.path.exists(ring.segment.path), flush=True)
    """
)


def test_a_child_that_exits_leaves_the_parents_channels_open() -> None:
    """A child forked inside ``with Ring.create(...)`` that exits through the block closed the
    parent's ring and board (marked CLOSED, unlinked) and its producer and consumer (the
    consumer's held records released, the producer's end seen by the consumer)."""
    done = subprocess.run(
        [sys.executable, "-c", CHANNELS_SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "ring file: True" in out and "board file: True" in out, out
    assert "opened again: True" in out, out
    assert "taken: 2" in out and "published: 1" in out and "read: 1 4.0" in out, out
    assert "after close: False" in out, out  # the parent, the owner, still unlinks
