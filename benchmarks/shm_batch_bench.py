"""Where a batched shm step spends its time (issue 24): env-steps/s at N over shm for the echo env
and the vectorised echo env, a server process and a client process, and the split of each step
into client Python, server Python (``_serve_batch``) and the rest (waits, wake-ups, the C loops).

    python benchmarks/shm_batch_bench.py [--envs 256] [--steps 2000] [--repeat 5]
        [--before DIR | --tree LABEL=DIR ...] [--profile client|server] [--stat median|min]

``--before DIR``: DIR holds another copy of ``transport/backends/shm`` (say, the code before a
change); each run is made twice, alternating, on a copy of this tree whose shm backend is DIR's,
and on this tree as it is (same machine, same load). ``--tree LABEL=DIR`` (repeatable) instead
runs whole trees (DIR holds a ``transport`` package: say, a copy of the code before a runtime
change), alternating in the order given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_SERVER = r"""
import cProfile, functools, io, pstats, sys, time
import transport
from transport.generated import pac_env
from transport.backends.shm import server as shm_server
kind, url, n, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
if kind in ("vector", "raw", "async-vector"):
    from transport.envs.vector_echo import VectorEchoEnv
    factory = functools.partial(VectorEchoEnv, n)
else:
    from transport.envs.echo import EchoEnv as factory
spent = [0, 0, 0]
inner = shm_server.Listener._serve_batch
from transport.runtime.core import EnvRuntime
runtime_step = EnvRuntime.step
def timed_step(self, actions):
    t = time.perf_counter_ns()
    try:
        return runtime_step(self, actions)
    finally:
        spent[2] += time.perf_counter_ns() - t
EnvRuntime.step = timed_step
if kind == "raw":  # the slot words alone: no runtime, no env (the floor of the C path)
    from transport import native
    def inner(self):
        ctx, pending = self._ctx, self._pending_ptr
        if native.lib.tp_server_pending(ctx, pending, self._command_offset, self._same_cmd):
            native.lib.tp_server_publish(ctx, pending, 0)
prof = cProfile.Profile() if profile else None
def timed(self):
    t = time.perf_counter_ns()
    if prof:
        prof.enable()
        inner(self)
        prof.disable()
    else:
        inner(self)
    spent[0] += time.perf_counter_ns() - t
    spent[1] += 1
shm_server.Listener._serve_batch = timed
server = transport.Server(factory, url, schema=pac_env.SCHEMA, num_envs=n)
server.start()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "zero":
        spent[:] = [0, 0, 0]
    elif line.strip() == "report":
        print(spent[0], spent[1], spent[2], flush=True)
if prof:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    print(out.getvalue(), file=sys.stderr)
server.close()
"""

_CLIENT = r"""
import cProfile, io, json, pstats, sys, time
import numpy as np
import transport
from transport.generated import pac_env
url, kind, stat = sys.argv[1], sys.argv[6], sys.argv[7]
n, steps, repeat = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
profile = sys.argv[5] == "1"
out = []
with transport.connect(url, pac_env.SCHEMA, autoreset="next_step", timeout=30) as client:
    client.reset(seed=1)
    channel = client.channel
    rt = getattr(channel, "_roundtrip", None)
    spent = [0]
    def timed(ctx, ns, rt=rt, clock=time.perf_counter_ns):
        t = clock()
        rc = rt(ctx, ns)
        spent[0] += clock() - t
        return rc
    if rt is not None:
        channel._roundtrip = timed
    actions = np.ones(n, dtype=np.uint8)
    step = lambda: client.step(actions)
    if kind.startswith("async"):  # asynchronous batches: SEND every env, RECV them all
        every = np.arange(n)
        client.async_reset(seed=1)
        client.recv(n)
        def step():
            client.send(actions, every)
            return client.recv(n)
    if kind == "raw":  # the channel's hot path alone (the actions already in the slots)
        body, req = channel._request_rows, channel._step_req
        step = lambda: channel.request(req, body)
    for _ in range(50):
        step()
    prof = cProfile.Profile() if profile else None
    rows = []
    for _ in range(repeat):
        print("zero", flush=True)
        spent[0] = 0
        if prof:
            prof.enable()
        t = time.perf_counter_ns()
        for _ in range(steps):
            step()
        total = time.perf_counter_ns() - t
        if prof:
            prof.disable()
        print("report", flush=True)
        server_ns, calls, runtime_ns = map(int, sys.stdin.readline().split())
        calls = max(calls, 1)
        rows.append((total / steps, spent[0] / steps, server_ns / calls, runtime_ns / calls))
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        print(s.getvalue(), file=sys.stderr)
rows.sort()
print("RESULT " + json.dumps(rows[0] if stat == "min" else rows[len(rows) // 2]), flush=True)
"""


def run_once(tree: Path, kind: str, args: argparse.Namespace) -> tuple[float, float, float, float]:
    """(us per step, us in the round trip, us in the server's _serve_batch, us of it in the
    runtime's step): the median of the repeats."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    name = f"shmbb-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    url = f"shm://{name}?num_envs={args.envs}" + (f"&wait={args.wait}" if args.wait else "")
    if kind.startswith("unix-"):  # the same env over a unix socket (issue 24: shm >= unix)
        kind, url = kind[5:], f"unix:///tmp/{name}.sock"
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SERVER,
            kind,
            url,
            str(args.envs),
            str(int(args.profile == "server")),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tree,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        assert server.stdout.readline().strip() == "ready"
        client = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CLIENT,
                url,
                str(args.envs),
                str(args.steps),
                str(args.repeat),
                str(int(args.profile == "client")),
                kind.removeprefix("unix-"),
                args.stat,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tree,
        )
        assert client.stdin is not None and client.stdout is not None
        result = None
        for line in client.stdout:  # relay the client's zero/report requests to the server
            line = line.strip()
            if line.startswith("RESULT "):
                result = json.loads(line[7:])
                break
            server.stdin.write(line + "\n")
            server.stdin.flush()
            if line == "report":
                client.stdin.write(server.stdout.readline())
                client.stdin.flush()
        client.wait(timeout=60)
        assert result is not None, "the client gave no result"
        total_ns, roundtrip_ns, serve_ns, runtime_ns = result
        return total_ns / 1e3, roundtrip_ns / 1e3, serve_ns / 1e3, runtime_ns / 1e3
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def before_tree(shm_dir: Path, tmp: Path) -> Path:
    """A copy of this tree's ``transport`` package with the shm backend of ``shm_dir``."""
    target = tmp / "before"
    shutil.copytree(
        ROOT / "transport", target / "transport", ignore=shutil.ignore_patterns("__pycache__")
    )
    shm = target / "transport" / "backends" / "shm"
    shutil.rmtree(shm)
    shutil.copytree(shm_dir, shm, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="alternations before/after")
    parser.add_argument("--before", type=Path, default=None)
    parser.add_argument("--kinds", default="echo,vector", help="echo, vector, raw, unix-KIND")
    parser.add_argument("--wait", default=None, help="the shm URL's wait policy")
    parser.add_argument("--profile", choices=["client", "server"], default=None)
    parser.add_argument(
        "--stat",
        choices=["median", "min"],
        default="median",
        help="which repeat a row shows: the median, or the fastest (on a shared machine the "
        "fastest of many short repeats is the one least disturbed by other processes)",
    )
    parser.add_argument(
        "--tree", action="append", default=[], help="LABEL=DIR: a whole tree to run (repeatable)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shmbb-") as tmp:
        trees = [("after", ROOT)]
        if args.before is not None:
            trees.insert(0, ("before", before_tree(args.before, Path(tmp))))
        if args.tree:
            trees = [
                (label, Path(path)) for label, _, path in (t.partition("=") for t in args.tree)
            ]
        print(
            f"N={args.envs}, {args.steps} steps x {args.repeat} ({args.stat}); us per step; "
            f"load average {_load()}"
        )
        print(
            f"{'env':11} {'code':7} {'step':>7} {'client py':>9} {'server py':>9} "
            f"{'runtime':>8} {'other':>7} {'env-steps/s':>12}"
        )
        for _ in range(args.rounds):
            for kind in args.kinds.split(","):
                for label, tree in trees:
                    total, roundtrip, serve, runtime = run_once(tree, kind, args)
                    client_py = total - roundtrip
                    print(
                        f"{kind:11} {label:7} {total:7.1f} {client_py:9.1f} {serve:9.1f} "
                        f"{runtime:8.1f} {roundtrip - serve:7.1f} {args.envs / total * 1e6:12,.0f}",
                        flush=True,
                    )
        print(f"load average at the end {_load()}")


def _load() -> str:
    """The 1, 5 and 15 minute load averages (figures of a busy machine are not comparable)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
