"""CURVE for zmq+tcp: server and client keys from URLs, files or the environment, the
allow-list of client keys, and ``keygen`` (``python -m transport.backends.zmq keygen DIR``)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import zmq
import zmq.auth
from zmq.utils import z85

from transport.backends.zmq.wire import (
    ENV_ALLOWED_CLIENTS,
    ENV_CLIENT_SECRET,
    ENV_CLIENTS_DIR,
    ENV_SERVER_PUBLIC,
    ENV_SERVER_SECRET,
    Address,
    log,
)
from transport.errors import (
    ConnectError,
)


def _z85_key(text: str, what: str) -> bytes:
    key = text.strip().encode("ascii", "replace")
    try:
        if len(key) != 40 or len(z85.decode(key)) != 32:
            raise ValueError("wrong length")
    except (ValueError, KeyError) as exc:
        raise ConnectError(f"{what} is not a 40-character Z85 CURVE key ({exc})") from None
    return key


def _load_key_file(path: str, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConnectError(f"cannot read the CURVE key file {path}: {exc}") from None
    if secret and secret_key is None:
        raise ConnectError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret_key


def _allowed_clients(address: Address) -> set[bytes]:
    allowed: set[bytes] = set()
    directory = address.params.get("clients") or os.environ.get(ENV_CLIENTS_DIR)
    if directory:
        if not os.path.isdir(directory):
            raise ConnectError(f"the allowed-clients directory {directory} does not exist")
        allowed.update(key for key in zmq.auth.load_certificates(directory))
    for text in os.environ.get(ENV_ALLOWED_CLIENTS, "").split(","):
        if text.strip():
            allowed.add(_z85_key(text, f"a key in {ENV_ALLOWED_CLIENTS}"))
    return allowed


def server_curve(address: Address) -> tuple[bytes, bytes, set[bytes]] | None:
    """(public, secret, allowed client public keys) when this server uses CURVE, else None."""
    if address.transport != "tcp":
        if "server_key" in address.params or "clients" in address.params:
            raise ConnectError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode")
        return None
    path = address.params.get("server_key")
    if path:
        public, secret = _load_key_file(path, secret=True)
        assert secret is not None
    elif os.environ.get(ENV_SERVER_SECRET):
        secret = _z85_key(os.environ[ENV_SERVER_SECRET], ENV_SERVER_SECRET)
        public = zmq.curve_public(secret)
    else:
        return None
    allowed = _allowed_clients(address)
    if not allowed:
        raise ConnectError(
            "a CURVE server needs the public keys of the clients it admits: "
            f"?clients=DIR, {ENV_CLIENTS_DIR}=DIR or {ENV_ALLOWED_CLIENTS}=KEY,KEY"
        )
    return public, secret, allowed


def client_curve(address: Address) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) when this client uses CURVE, else None."""
    if address.transport != "tcp":
        if "server_key" in address.params or "client_key" in address.params:
            raise ConnectError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode")
        return None
    path = address.params.get("server_key")
    if path:
        server_public, _ = _load_key_file(path, secret=False)
    elif os.environ.get(ENV_SERVER_PUBLIC):
        server_public = _z85_key(os.environ[ENV_SERVER_PUBLIC], ENV_SERVER_PUBLIC)
    else:
        server_public = b""
    path = address.params.get("client_key")
    client_secret: bytes | None
    if path:
        client_public, client_secret = _load_key_file(path, secret=True)
    elif os.environ.get(ENV_CLIENT_SECRET):
        client_secret = _z85_key(os.environ[ENV_CLIENT_SECRET], ENV_CLIENT_SECRET)
        client_public = zmq.curve_public(client_secret)
    else:
        client_secret = None
        client_public = b""
    if not server_public and client_secret is None:
        return None
    if not server_public:
        raise ConnectError(
            "a CURVE client needs the server's public key "
            f"(?server_key=FILE or {ENV_SERVER_PUBLIC})"
        )
    if client_secret is None:
        raise ConnectError(
            f"a CURVE client needs its own key pair (?client_key=FILE or {ENV_CLIENT_SECRET})"
        )
    return server_public, client_public, client_secret


class _AllowList:
    """ZAP credentials provider: admits exactly the listed client public keys."""

    def __init__(self, allowed: set[bytes]) -> None:
        self.allowed = frozenset(allowed)

    def callback(self, domain: str, key: bytes) -> bool:
        admitted = key in self.allowed
        if not admitted:
            log.warning("refused a CURVE client with key %s", key.decode("ascii", "replace"))
        return admitted


_KEY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
"""A key pair's name: a plain file name (no folder, no leading dot or dash), at most 100 chars."""


def check_key_name(name: str) -> str:
    """``name`` if it is a plain key name, else ``ConnectError``: ``../evil`` or ``a/b`` would
    write outside the keys folder, ``.x`` would hide the file, ``-x`` reads as an option."""
    if not _KEY_NAME.fullmatch(name):
        raise ConnectError(
            f"key name {name!r} is not a plain name (1-100 characters of A-Z a-z 0-9 _ . -, "
            "not starting with . or -): the files are DIR/NAME.key and DIR/NAME.key_secret"
        )
    return name


def keygen(directory: str, names: list[str], *, force: bool = False) -> list[dict[str, str]]:
    """Create CURVE key pairs ``DIR/NAME.key`` (public) and ``DIR/NAME.key_secret`` (0600);
    every name is checked (``check_key_name``) before anything is created."""
    for name in names:
        check_key_name(name)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    made = []
    for name in names:
        secret_path = os.path.join(directory, f"{name}.key_secret")
        if os.path.exists(secret_path) and not force:
            raise ConnectError(f"{secret_path} exists (pass --force to replace it)")
        public_file, secret_file = zmq.auth.create_certificates(directory, name)
        os.chmod(secret_file, 0o600)
        public, secret = zmq.auth.load_certificate(secret_file)
        assert secret is not None
        made.append(
            {
                "name": name,
                "public_file": str(public_file),
                "secret_file": str(secret_file),
                "public_key": public.decode("ascii"),
            }
        )
    return made


def _key_name(text: str) -> str:
    try:
        return check_key_name(text)
    except ConnectError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    from transport.tools.cli_args import ArgumentParser

    parser = ArgumentParser(
        prog="python -m transport.backends.zmq",
        description="ZeroMQ backend tools. keygen: create CURVE key pairs for zmq+tcp.",
        epilog=(
            "Server: zmq+tcp://0.0.0.0:5555?server_key=DIR/server.key_secret&clients=DIR/clients"
            "  Client: zmq+tcp://HOST:5555?server_key=DIR/server.key&client_key="
            "DIR/client.key_secret (copy client.key into the server's clients directory)."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("keygen", help="create NAME.key and NAME.key_secret in DIR")
    gen.add_argument("directory", metavar="DIR")
    gen.add_argument(
        "--name",
        action="append",
        type=_key_name,
        help="key pair name, a plain file name (repeatable; default: server, client)",
    )
    gen.add_argument("--force", action="store_true", help="replace existing key files")
    gen.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    try:
        made = keygen(args.directory, args.name or ["server", "client"], force=args.force)
    except (ConnectError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(made, indent=2))
    else:
        for entry in made:
            print(f"{entry['name']}: {entry['secret_file']} (public key {entry['public_key']})")
    return 0
