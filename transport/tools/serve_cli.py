"""transport-serve: run an env server (a reference env or your own, Python or Node) on any URL."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transport.codec import Schema
from transport.envs import ENVS, env_factory, env_schema
from transport.errors import ProtocolError, SchemaError, TransportError
from transport.schema.compiler import check_schema_file
from transport.tools import quiet_on_broken_pipe
from transport.tools.cli_args import ArgumentParser

_DESCRIPTION = """\
Serve an env until SIGINT or SIGTERM: a reference env by name, or your own env factory as
package.module:Factory (Python) or path/to/module.js:Factory (Node). Prints one line
"ready URL" on stdout once clients can connect (with http://127.0.0.1:0 the URL carries the
port that was bound).

  transport-serve unix:///tmp/pac.sock --env pac --lang node
  transport-serve unix:///tmp/g.sock --env mygame.envs:GridWorld --schema grid.toml --num-envs 16
                                          (mygame from the current folder, as python -m finds it)
  transport-serve unix:///tmp/g.sock --env ./dist/grid.js:GridWorld --schema grid.toml --lang node
                                          (Node compiles grid.toml with transport-schema)
  transport-serve http://127.0.0.1:8080 --env echo --num-envs 8
  transport-serve unix:///tmp/pac.sock --env pac --num-envs 8 --masked-actions noop
                                          for trainers that ignore masks (plain PPO)
  transport-serve "shm://pac?num_envs=32" --env pac       (region /dev/shm/transport-pac)
  transport-serve zmq+ipc:///tmp/pac.zmq --env pac --lang node
  transport-serve "zmq+tcp://0.0.0.0:5555?server_key=keys/server.key_secret&clients=keys/clients"
                                          CURVE: only clients whose key is in keys/clients
  transport-serve unix:///tmp/cp.sock --gym CartPole-v1 --num-envs 8
                                          a gymnasium env, schema derived from its spaces
                                          (clients discover it: no schema file anywhere)
  transport-serve --list-shm [--json]     the project's shared-memory regions, stale or live
  transport-serve --cleanup-shm [--json]  remove the stale ones (whose server is dead)

Envs: echo (a deterministic result derived from the action: pure transport cost), vector-echo
(the same bytes from one vector env object that steps all --num-envs envs: the transport
without per-env Python; in process only, no --workers), pac (a seeded synthetic game on the
pac_env schema, identical bytes from the Python and Node servers) and mahjong (a four-seat
turn-based tile game on the mahjong_env schema; identical in both).
zmq+tcp refuses a non-loopback address without CURVE keys (URL query or TRANSPORT_ZMQ_*
variables) unless ?allow_insecure=1. Keys: `python -m transport.backends.zmq keygen DIR`
(docs/zmq.md).
Exit status: 0 after a signal; 1 when the server cannot start (address in use, bad URL, a
CURVE key that is missing, malformed or readable by others) or
stops serving on its own (e.g. another process wrote CLOSED to its shm region's state word; a
line on stderr says why), and after --cleanup-shm when a stale segment could not be removed;
2 for a bad command line or limit (--num-envs 1..65536, --max-body, --max-connections,
--idle-timeout, --read-timeout: each must be positive; --seed outside
0..2**64 - N), a schema file that cannot be read or compiled (or has no [env] table), an --env
that cannot be loaded or whose factory fails to make an env ("cannot serve these envs: ..."),
or a reference env given a --schema other than its own (--env contract serves any schema).
Limits (unix, http; docs/server.md): at most --max-connections clients at once (default 1024;
one more gets a "server busy" ERROR, on http a 503, and is closed), a connection idle for
--idle-timeout seconds is closed (default 600), and a request must arrive completely within
--read-timeout seconds of its first byte (default 30; slow senders are closed).
"""


SEED_MAX = 2**64 - 1
"""The largest seed (a u64 on the wire); with N envs the first seed is at most SEED_MAX + 1 - N."""

JS_SUFFIXES = (".js", ".mjs", ".cjs")


NODE_SERVER_ENV = "TRANSPORT_NODE_SERVER"
"""Names the Node server's script (``.../dist/cli/serve.js``) where it is not found by itself."""


def node_server_script() -> Path:
    """The Node server's script: ``$TRANSPORT_NODE_SERVER``, else this checkout's built
    node_bridge, else the npm package @transport/node-bridge installed in the current folder or
    one above it (a project that uses both packages); the checkout's path when none is there."""
    given = os.environ.get(NODE_SERVER_ENV)
    if given:
        return Path(given)
    checkout = Path(__file__).resolve().parents[2] / "node_bridge" / "dist" / "cli" / "serve.js"
    if checkout.is_file():
        return checkout
    here = Path.cwd()
    for folder in (here, *here.parents):
        found = folder / "node_modules" / "@transport" / "node-bridge" / "dist" / "cli" / "serve.js"
        if found.is_file():
            return found
    return checkout


@quiet_on_broken_pipe
def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="transport-serve",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "url",
        nargs="?",
        help="where to listen: unix:///path.sock, http://127.0.0.1:PORT, shm://name?num_envs=N,"
        " zmq+ipc:///path, zmq+tcp://HOST:PORT",
    )
    parser.add_argument(
        "--env",
        default=None,  # echo; None tells an --env given with --gym from none
        help=f"a reference env ({', '.join(sorted(ENVS))}) or your env factory: "
        "package.module:Factory (Python: a class or a zero-argument callable) or "
        "path/to/module.js:Factory (Node); default echo",
    )
    parser.add_argument(
        "--gym",
        default=None,
        metavar="ENV_ID",
        help="serve the gymnasium env gymnasium.make(ENV_ID) with the schema derived from its "
        "spaces (Python server only; instead of --env and --schema)",
    )
    parser.add_argument(
        "--gym-kwargs",
        default=None,
        metavar="JSON",
        help="keyword arguments of gymnasium.make, a JSON object (with --gym)",
    )
    parser.add_argument(
        "--shm-layout",
        choices=("slots", "columns"),
        default=None,
        help="with --gym: the shm region's layout, per-env slots (default) or columns (each "
        "field of all envs contiguous: one block per field for a trainer; docs/shm.md)",
    )
    parser.add_argument(
        "--schema",
        type=Path,
        default=None,
        help="the schema file (TOML) your env's results follow; default: the reference env's "
        "schema, or a SCHEMA attribute of your factory or its module",
    )
    parser.add_argument(
        "--lang", default="python", choices=["python", "node"], help="server implementation"
    )
    parser.add_argument(
        "--num-envs",
        type=int,
        default=None,
        help="envs per connection, 1..65536 (N; default 1, or the shm:// URL's num_envs)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the first unseeded reset (env i: S + i); a u64: 0..2**64 - N with N envs",
    )
    parser.add_argument(
        "--masked-actions",
        choices=("reject", "pass", "noop"),
        default="reject",
        help="an action the env's mask forbids: reject it (MASKED_ACTION, default), pass it to "
        "the env, or noop (the env does not step; reward env.masked_action_penalty)",
    )
    parser.add_argument(
        "--max-body", type=int, default=None, help="largest request body accepted, in bytes"
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="unix/http: connections served at once; one more is refused with an ERROR "
        "(HTTP 503) and closed (default 1024)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        help="unix/http: seconds a connection may stay idle between requests; zmq: a session "
        "(default 600)",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=None,
        help="unix/http: seconds a started request has to arrive completely, and a response "
        "to be taken (default 30)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="step each connection's envs in K worker processes (Python) or worker threads "
        "(Node); 0, the default: in the server process",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=None,
        metavar="S",
        help="with --workers: seconds one worker may take over a lock-step request before it "
        "counts as stuck: it is replaced and its envs fail with ENV_ERROR (default 60)",
    )
    parser.add_argument(
        "--list-shm", action="store_true", help="list /dev/shm/transport-* regions and exit"
    )
    parser.add_argument(
        "--cleanup-shm", action="store_true", help="remove stale /dev/shm/transport-* regions"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable --list/--cleanup")
    args = parser.parse_args(argv)
    if args.list_shm or args.cleanup_shm:
        return _shm_admin(cleanup=args.cleanup_shm, as_json=args.json)
    if args.url is None:
        parser.error("a URL is required (or --list-shm / --cleanup-shm)")
    url_num_envs = _url_num_envs(args.url)
    if args.num_envs is None:
        args.num_envs = url_num_envs or 1
    elif url_num_envs is not None and args.num_envs not in (1, url_num_envs):
        # the shm server's rule (a URL's num_envs wins over 1 only), refused now: exit 2
        parser.error(
            f"{args.url} asks for {url_num_envs} envs but --num-envs is {args.num_envs}: give "
            "the same number, or one of them"
        )
    from transport.api import MAX_BODY_LIMIT, MAX_NUM_ENVS
    from transport.protocol import DEFAULT_MAX_BODY

    # start-up validation, the same rules as the Node server's (docs/decisions.md)
    if not 1 <= args.num_envs <= MAX_NUM_ENVS:
        parser.error(f"--num-envs must be 1..{MAX_NUM_ENVS}, not {args.num_envs}")
    if args.max_body is not None and not 1 <= args.max_body <= MAX_BODY_LIMIT:
        parser.error(f"--max-body must be 1..{MAX_BODY_LIMIT} bytes, not {args.max_body}")
    max_body = DEFAULT_MAX_BODY if args.max_body is None else args.max_body
    if args.workers < 0:
        parser.error("--workers must be 0 (in-process) or more")
    if args.step_timeout is not None and not args.step_timeout > 0:
        parser.error(
            f"--step-timeout must be a positive number of seconds, not {args.step_timeout}"
        )
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX + 1 - args.num_envs:
        # env i of a connection gets seed + i, a u64 on the wire (the Node CLI's rule and words)
        parser.error(
            f"--seed must be 0..{SEED_MAX + 1 - args.num_envs}, not {args.seed} (seeds are "
            f"u64 on the wire; env i gets seed + i, i < --num-envs {args.num_envs})"
        )
    limits = _limits(parser, args)
    if args.gym is not None or args.gym_kwargs is not None or args.shm_layout is not None:
        return _serve_gym(parser, args, max_body, limits)
    if args.env is None:
        args.env = "echo"
    if args.env not in ENVS and ":" not in args.env:
        parser.error(
            f"--env {args.env!r}: not a reference env ({', '.join(sorted(ENVS))}) and not a "
            "factory spec package.module:Factory (Python) or path/to/module.js:Factory (Node)"
        )

    if args.lang == "node":
        script = node_server_script()
        node = shutil.which("node")
        if node is None or not script.is_file():
            print(
                f"transport-serve: error: the Node server needs node and {script} (in a "
                "checkout: ./dev setup; elsewhere: npm install the @transport/node-bridge "
                f"package in this folder, or set {NODE_SERVER_ENV} to its dist/cli/serve.js)",
                file=sys.stderr,
            )
            return 1
        command = [node, str(script), args.url, "--env", args.env, "--num-envs", str(args.num_envs)]
        if args.schema is not None:
            command += ["--schema", str(args.schema)]
        if args.seed is not None:
            command += ["--seed", str(args.seed)]
        if args.max_body is not None:
            command += ["--max-body", str(args.max_body)]
        if args.workers:
            command += ["--workers", str(args.workers)]
        if args.step_timeout is not None:
            command += ["--step-timeout", str(args.step_timeout)]
        for flag in ("max_connections", "idle_timeout", "read_timeout"):
            if getattr(args, flag) is not None:
                command += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
        if args.masked_actions != "reject":
            command += ["--masked-actions", args.masked_actions]
        if "TRANSPORT_SCHEMA_CLI" not in os.environ:  # Node compiles --schema FILE.toml with it
            beside = Path(sys.executable).with_name("transport-schema")
            found = beside if beside.is_file() else shutil.which("transport-schema")
            if found is not None:
                os.environ["TRANSPORT_SCHEMA_CLI"] = str(found)
        sys.stdout.flush()
        os.execv(node, command)  # signals go straight to the Node server

    try:
        factory, schema = _env_and_schema(args.env, args.schema, args.num_envs)
    except (SchemaError, _EnvSpecError) as exc:
        print(f"transport-serve: error: {exc}", file=sys.stderr)
        return 2
    env_name = args.env.rpartition(":")[2] if args.env not in ENVS else args.env
    return _serve_python(args, factory, schema, env_name, max_body, limits)


def gym_kwargs_of(parser: argparse.ArgumentParser, text: str | None) -> dict[str, Any]:
    """--gym-kwargs: a JSON object (a usage error, one line, otherwise)."""
    if text is None:
        return {}
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        parser.error(f"--gym-kwargs is not JSON: {exc}")
    if not isinstance(value, dict):
        parser.error(f"--gym-kwargs must be a JSON object, not {text!r}")
    return value


def _serve_gym(
    parser: argparse.ArgumentParser, args: argparse.Namespace, max_body: int, limits: Any
) -> int:
    """--gym ENV_ID: a gymnasium env, schema derived from its spaces (transport.gym_serve)."""
    if args.gym is None:
        if args.gym_kwargs is not None:
            parser.error("--gym-kwargs needs --gym ENV_ID (they go to gymnasium.make)")
        parser.error(
            "--shm-layout needs --gym ENV_ID (a schema file says its layout with [env] shm)"
        )
    if args.lang == "node":
        parser.error("--gym serves a gymnasium (Python) env: --lang node cannot serve it")
    if args.schema is not None or args.env is not None:
        parser.error("--gym derives the schema from the env's spaces: drop --env and --schema")
    kwargs = gym_kwargs_of(parser, args.gym_kwargs)
    _import_from_current_folder()  # an id "module:Env-v0" imports module from here
    try:
        from transport.gym_serve import gym_factory_and_schema
    except ImportError as exc:
        print(f"transport-serve: error: --gym needs gymnasium ({exc})", file=sys.stderr)
        return 2
    try:
        factory, schema = gym_factory_and_schema(args.gym, kwargs, args.shm_layout or "slots")
    except SchemaError as exc:
        print(f"transport-serve: error: --gym {args.gym}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # gymnasium.make: an unknown id, bad kwargs
        print(f"transport-serve: error: --gym {args.gym}: {_one_line(exc)}", file=sys.stderr)
        return 2
    return _serve_python(args, factory, schema, args.gym, max_body, limits)


def _serve_python(
    args: argparse.Namespace,
    factory: Any,
    schema: Any,
    env_name: str,
    max_body: int,
    limits: Any,
) -> int:
    """Serve ``factory`` with the Python server until a signal: 0, or 1 (a transport error
    while serving) / 2 (a setup the server cannot serve, refused before ready), one line."""
    from transport.api import check_server_limits, serve

    try:
        check_server_limits(schema, args.url, num_envs=args.num_envs, max_body=max_body)
    except (ValueError, ProtocolError) as exc:
        print(f"transport-serve: error: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"ready {url}", flush=True)

    try:
        serve(
            factory,
            args.url,
            schema=schema,
            num_envs=args.num_envs,
            env_name=env_name,
            seed=args.seed,
            max_body=max_body,
            ready=ready,
            workers=args.workers,
            limits=limits,
            masked_actions=args.masked_actions,
            step_timeout=args.step_timeout,
        )
    except TransportError as exc:
        print(f"transport-serve: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # a setup the server cannot serve (refused before ready)
        print(f"transport-serve: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The ``ServerLimits`` of --max-connections/--idle-timeout/--read-timeout (defaults for
    the ones not given); a non-positive value is a usage error (exit 2)."""
    from transport.api import ServerLimits

    given = {
        name: getattr(args, name)
        for name in ("max_connections", "idle_timeout", "read_timeout")
        if getattr(args, name) is not None
    }
    try:
        return ServerLimits(**given)
    except ValueError as exc:
        flag = "--" + str(exc).split(" ", 1)[0].replace("_", "-")
        parser.error(f"{flag}: {exc}")


class _EnvSpecError(Exception):
    """--env names a factory that cannot be loaded, or a reference env was given a schema that
    is not its own (the message says why)."""


def _env_and_schema(
    spec: str, schema_file: Path | None, num_envs: int = 1
) -> tuple[Callable[[], Any], Schema]:
    """The env factory and schema for ``--env`` / ``--schema`` (the file wins); a schema that
    cannot be served (no ``[env]`` table) is refused here, before anything is created. A
    reference vector env (``vector-echo``) is made as one object of ``num_envs`` envs."""
    factory, schema = _load_env_and_schema(spec, schema_file, num_envs)
    if schema.ir.env is None:
        raise SchemaError(
            f"schema {schema.name} has no [env] table: a served schema names its result and "
            "request structs there (docs/schema.md)",
            file=str(schema_file) if schema_file is not None else "",
        )
    return factory, schema


def _load_env_and_schema(
    spec: str, schema_file: Path | None, num_envs: int
) -> tuple[Callable[[], Any], Schema]:

    if spec == "contract":  # the contract suite's env, for any schema (--schema FILE or NAME)
        from transport.testing.contract_env import contract_factory

        schema = _schema_given(schema_file or Path("pac_env"))
        return contract_factory(schema), schema
    if spec in ENVS:
        own = env_schema(spec)
        if schema_file is None:
            return env_factory(spec, num_envs), own
        given = _schema_given(schema_file)
        if given.fingerprint != own.fingerprint:
            raise _EnvSpecError(_schema_mismatch(spec, own, given, str(schema_file)))
        return env_factory(spec, num_envs), given
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise _EnvSpecError(f"--env {spec!r}: expected package.module:Factory")
    _import_from_current_folder()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raises on import
        hint = _path_hint(module_name, attr)
        if hint:
            raise _EnvSpecError(f"--env {spec!r}: cannot import {module_name}: {hint}") from exc
        raise _EnvSpecError(
            f"--env {spec!r}: cannot import {module_name}: {type(exc).__name__}: {exc} "
            "(is it in the current folder, on PYTHONPATH, or installed?)"
        ) from exc
    found = getattr(module, attr, None)
    if not callable(found):
        raise _EnvSpecError(
            f"--env {spec!r}: {module_name} has no callable {attr} (a class or a "
            "zero-argument function that returns an env)"
        )
    if schema_file is not None:
        return found, _schema_given(schema_file)
    declared = getattr(found, "SCHEMA", None) or getattr(module, "SCHEMA", None)
    if not isinstance(declared, Schema):
        raise _EnvSpecError(
            f"--env {spec!r}: pass --schema FILE (the schema its results follow), or give "
            f"{attr} or {module_name} a SCHEMA attribute (transport.load_schema(...))"
        )
    return found, declared


def _path_hint(module_name: str, attr: str) -> str:
    """Why ``module_name`` did not import when it is a file, not a module (else ""): a
    JavaScript module is served with ``--lang node``; a path (``./envs/robo.py``) is named by
    its module (``envs.robo``) instead."""
    if module_name.lower().endswith(JS_SUFFIXES):
        return (
            "it is a JavaScript module: serve it with --lang node (the Python server imports "
            "package.module:Factory)"
        )
    if not (module_name.endswith(".py") or "/" in module_name or os.sep in module_name):
        return ""
    example = ""
    if module_name.endswith(".py"):
        parts = [p for p in Path(module_name[:-3]).parts if p != "."]
        if parts and all(p.isidentifier() for p in parts):
            example = f" (here --env {'.'.join(parts)}:{attr}, from the folder that holds it)"
    return (
        "a Python env is named by its module, package.module:Factory, importable from the "
        f"current folder or PYTHONPATH, not by a path{example}; a JavaScript module "
        "(path/to/module.js:Factory) needs --lang node"
    )


def _schema_given(spec: Path) -> Schema:
    """--schema: a file (TOML, or an IR .json), or a built-in schema by name (``pac_env``;
    ``schema/NAME.toml`` stands for NAME where no such file is), as the Node CLI takes it."""
    from transport.testing.contract_env import schema_named

    if spec.exists() or _names_a_file(spec):
        check_schema_file(spec)  # the loader's words for a missing or special file
    return schema_named(spec)


def _names_a_file(spec: Path) -> bool:
    """``--schema`` names a file, not a built-in schema: a .toml or .json path whose file name
    is not a generated schema's (schema/NAME.toml stands for NAME, as in the Node CLI)."""
    import importlib.util

    if spec.suffix not in (".toml", ".json"):
        return False
    if spec.suffix == ".toml" and spec.stem.isidentifier() and not spec.exists():
        return importlib.util.find_spec(f"transport.generated.{spec.stem}") is None
    return True


def _schema_mismatch(env: str, own: Schema, given: Schema, file: str) -> str:
    """The refusal of a reference env given another schema; the Node CLI says the same."""
    return (
        f"--env {env} speaks schema {own.name} ({own.fingerprint:016x}), not {given.name} "
        f"({given.fingerprint:016x}) of --schema {file}: every step would fail; serve any "
        "schema with --env contract, or your env with --env module:Factory"
    )


def _import_from_current_folder() -> None:
    """Let ``--env mod:Factory`` find ``mod`` in the current folder, as ``python -m`` does
    (a console script's ``sys.path`` starts at its own bin folder, not the current one)."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def _url_num_envs(url: str) -> int | None:
    if not url.lower().startswith("shm://"):
        return None
    from transport.backends.shm.region import parse_url

    try:
        return parse_url(url).num_envs
    except TransportError:
        return None  # the server reports the bad URL itself


def _shm_admin(*, cleanup: bool, as_json: bool) -> int:
    """--list-shm / --cleanup-shm: 0, or 1 when a stale segment could not be removed."""
    import json

    from transport.backends.shm.region import cleanup_stale, list_segments

    errors: list[str] = []
    infos = cleanup_stale(errors) if cleanup else list_segments()
    for text in errors:
        print(f"transport-serve: {text}", file=sys.stderr)
    if as_json:
        print(json.dumps([info.to_json() for info in infos], indent=2))
        return 1 if errors else 0
    if not infos:
        channels = "(channels: python -m transport.channels --list)"
        print(
            ("no stale regions " if cleanup else "no regions under /dev/shm/transport-* ")
            + channels
        )
    for info in infos:
        if cleanup:
            print(f"removed {info.path} (owner pid {info.owner_pid or '-'} is gone)")
        else:
            print(info.describe())
    return 1 if errors else 0
    if not infos:
        print("no stale regions" if cleanup else "no regions under /dev/shm/transport-*")
        return 0
    for info in infos:
        if cleanup:
            print(f"removed {info.path} (owner pid {info.owner_pid or '-'} is gone)")
            continue
        verdict = "stale" if info.stale else "live"
        print(
            f"{info.path}  {verdict}  state={info.state} envs={info.num_envs} "
            f"owner={info.owner_pid or '-'} client={info.client_pid or '-'} size={info.size}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
