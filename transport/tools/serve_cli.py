"""transport-serve: run a reference env server (Python or Node) on any backend URL."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from transport.envs import ENVS, env_factory
from transport.errors import TransportError

_DESCRIPTION = """\
Serve a reference env until SIGINT or SIGTERM. Prints one line "ready URL" on stdout once
clients can connect (with http://127.0.0.1:0 the URL carries the port that was bound).

  transport-serve unix:///tmp/pac.sock --env pac --lang node
  transport-serve http://127.0.0.1:8080 --env echo --num-envs 8

Envs: echo (a deterministic result derived from the action: pure transport cost) and pac (a
seeded synthetic game on the pac_env schema, identical bytes from the Python and Node servers).
Exit status: 0 after a signal, 1 when the server cannot start (address in use, bad URL).
"""


def node_server_script() -> Path:
    return Path(__file__).resolve().parents[2] / "node_bridge" / "dist" / "cli" / "serve.js"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="transport-serve",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", help="where to listen: unix:///path.sock, http://127.0.0.1:PORT")
    parser.add_argument("--env", default="echo", choices=sorted(ENVS), help="reference env")
    parser.add_argument(
        "--lang", default="python", choices=["python", "node"], help="server implementation"
    )
    parser.add_argument("--num-envs", type=int, default=1, help="envs per connection (N)")
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of the first unseeded reset (env i: S + i)"
    )
    parser.add_argument(
        "--max-body", type=int, default=None, help="largest request body accepted, in bytes"
    )
    args = parser.parse_args(argv)
    if args.num_envs < 1:
        parser.error("--num-envs must be at least 1")

    if args.lang == "node":
        script = node_server_script()
        node = shutil.which("node")
        if node is None or not script.is_file():
            print(
                f"transport-serve: error: the Node server needs node and {script} "
                "(run ./dev setup to build node_bridge)",
                file=sys.stderr,
            )
            return 1
        command = [node, str(script), args.url, "--env", args.env, "--num-envs", str(args.num_envs)]
        if args.seed is not None:
            command += ["--seed", str(args.seed)]
        if args.max_body is not None:
            command += ["--max-body", str(args.max_body)]
        sys.stdout.flush()
        os.execv(node, command)  # signals go straight to the Node server

    from transport.api import serve
    from transport.protocol import DEFAULT_MAX_BODY

    def ready(url: str) -> None:
        print(f"ready {url}", flush=True)

    try:
        serve(
            env_factory(args.env),
            args.url,
            num_envs=args.num_envs,
            env_name=args.env,
            seed=args.seed,
            max_body=args.max_body or DEFAULT_MAX_BODY,
            ready=ready,
        )
    except TransportError as exc:
        print(f"transport-serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
