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
