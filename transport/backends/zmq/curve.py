"""CURVE for zmq+tcp: server and client keys from URLs, files or the environment, the
allow-list of client keys, and ``keygen`` (``python -m transport.backends.zmq keygen DIR``)."""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys

import zmq

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

Z85_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUES = {char: value for value, char in enumerate(Z85_CHARS)}


class CurveKeyError(ConnectError):
    """A CURVE key this process was given (a key file, a key variable, the URL's key
    parameters) is unusable: this process's own configuration, so a client says no "is a server
    serving this URL?" hint after it (``local_config``)."""

    local_config = True


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ RFC 32) text -> bytes, ``ValueError`` in the Node side's words (wire.ts)."""
    if len(text) % 5:
        raise ValueError("z85 text length is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for char in text[i : i + 5]:
            digit = _Z85_VALUES.get(char)
            if digit is None:
                raise ValueError(f"{json.dumps(char, ensure_ascii=False)} is not a z85 character")
            value = value * 85 + digit
        if value > 0xFFFFFFFF:
            raise ValueError("z85 group out of range")
        out += value.to_bytes(4, "big")
    return bytes(out)


def _z85_key(text: str, what: str) -> bytes:
    """The 40-character Z85 text of a CURVE key (checked: length, alphabet, decodes)."""
    key = text.strip()
    try:
        if len(key) != 40:
            raise ValueError("wrong length")
        z85_decode(key)
    except ValueError as exc:
        raise CurveKeyError(f"{what} is not a 40-character Z85 CURVE key ({exc})") from None
    return key.encode("ascii")


def _read_key_text(path: str) -> tuple[str, int]:
    """The text of a key file and its permission bits (0 for a file without a name, such as a
    memfd: no other user can open it, whatever its mode says)."""
    try:
        with open(path, "rb") as file:
            info = os.fstat(file.fileno())
            mode = stat.S_IMODE(info.st_mode) if info.st_nlink else 0
            data = file.read()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CurveKeyError(f"cannot read the CURVE key file {path}: {reason}") from None
    return data.decode("utf-8", "replace"), mode


def _key_field(text: str, name: str) -> str | None:
    match = re.search(rf'^\s*{name}\s*=\s*"?([^"\s]+)"?\s*$', text, re.MULTILINE)
    return match.group(1) if match else None


def _load_key_file(path: str, *, secret: bool) -> tuple[bytes, bytes | None]:
    """A ZPL certificate as keygen (pyzmq) writes it: (public, secret or None), both Z85 text.
    A secret key's file must be private (``chmod 600``, as ssh asks of its keys) and its public
    key the secret's. Node: ``loadKeyFile``, in the same words."""
    text, mode = _read_key_text(path)
    public_text = _key_field(text, "public-key")
    if public_text is None:
        raise CurveKeyError(f"cannot read the CURVE key file {path}: no public-key")
    public = _z85_key(public_text, f"the public key in {path}")
    secret_text = _key_field(text, "secret-key")
    if secret and secret_text is None:
        raise CurveKeyError(f"{path} holds no secret key (use the .key_secret file)")
    if secret_text is None:
        return public, None
    secret_key = _z85_key(secret_text, f"the secret key in {path}")
    if zmq.curve_public(secret_key) != public:
        raise CurveKeyError(
            f"the public key in {path} is not its secret key's (the file was changed: make a "
            "new pair with keygen)"
        )
    if secret and mode & 0o077:
        raise CurveKeyError(
            f"{path} holds a CURVE secret key but group or others may read or change it "
            f"(mode {mode:04o}): chmod 600 {path}"
        )
    return public, secret_key


def _url_path(address: Address, name: str) -> str | None:
    """The URL's ``name=PATH`` (None when absent); an empty value is an error, not absent."""
    if name not in address.params:
        return None
    value = address.params[name]
    if not value:
        raise CurveKeyError(
            f"?{name}= is empty: give a path (percent-encoded), or leave the parameter out"
        )
    return value


def _check_not_world_writable(path: str, mode: int, what: str) -> None:
    if mode & 0o002:
        raise CurveKeyError(
            f"{what} {path} is writable by anyone (mode {mode:04o}), who could admit a key of "
            f"their own: chmod o-w {path}"
        )


def _allowed_clients(address: Address) -> set[bytes]:
    """The admitted client keys: the URL's ``clients=DIR`` alone when given (the URL wins over
    the environment), else the environment's directory and list."""
    allowed: set[bytes] = set()
    directory = _url_path(address, "clients")
    from_url = directory is not None
    if not from_url:
        directory = os.environ.get(ENV_CLIENTS_DIR) or None
    if directory is not None:
        if not os.path.isdir(directory):
            raise CurveKeyError(f"the allowed-clients directory {directory} does not exist")
        _check_not_world_writable(
            directory, stat.S_IMODE(os.stat(directory).st_mode), "the allowed-clients directory"
        )
        for name in sorted(os.listdir(directory)):
            if name.endswith(".key"):
                path = os.path.join(directory, name)
                public, _ = _load_key_file(path, secret=False)
                _check_not_world_writable(
                    path, stat.S_IMODE(os.stat(path).st_mode), "the CURVE key file"
                )
                allowed.add(public)
    if not from_url:
        for text in os.environ.get(ENV_ALLOWED_CLIENTS, "").split(","):
            if text.strip():
                allowed.add(_z85_key(text, f"a key in {ENV_ALLOWED_CLIENTS}"))
    return allowed


def _allow_list_source(address: Address) -> str | None:
    if "clients" in address.params:
        return "?clients=DIR"
    for name in (ENV_CLIENTS_DIR, ENV_ALLOWED_CLIENTS):
        if os.environ.get(name, "").strip():
            return name
    return None


def server_curve(address: Address) -> tuple[bytes, bytes, set[bytes]] | None:
    """(public, secret, allowed client public keys) when this server uses CURVE, else None.
    An allow list without the server's key pair is refused: it would serve without CURVE."""
    if address.transport != "tcp":
        if "server_key" in address.params or "clients" in address.params:
            raise CurveKeyError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode")
        return None
    path = _url_path(address, "server_key")
    if path is not None:
        public, secret = _load_key_file(path, secret=True)
        assert secret is not None
    elif os.environ.get(ENV_SERVER_SECRET):
        secret = _z85_key(os.environ[ENV_SERVER_SECRET], ENV_SERVER_SECRET)
        public = zmq.curve_public(secret)
    else:
        source = _allow_list_source(address)
        if source is not None:
            raise CurveKeyError(
                f"{source} admits clients by their CURVE keys, but this server has no key pair "
                f"(?server_key=DIR/server.key_secret or {ENV_SERVER_SECRET}): it would serve "
                "without CURVE"
            )
        return None
    allowed = _allowed_clients(address)
    if not allowed:
        raise CurveKeyError(
            "a CURVE server needs the public keys of the clients it admits: "
            f"?clients=DIR, {ENV_CLIENTS_DIR}=DIR or {ENV_ALLOWED_CLIENTS}=KEY,KEY"
        )
    return public, secret, allowed


def client_curve(address: Address) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) when this client uses CURVE, else None."""
    if address.transport != "tcp":
        if "server_key" in address.params or "client_key" in address.params:
            raise CurveKeyError("CURVE keys are for zmq+tcp; zmq+ipc is guarded by the file mode")
        return None
    path = _url_path(address, "server_key")
    if path is not None:
        server_public, _ = _load_key_file(path, secret=False)
    elif os.environ.get(ENV_SERVER_PUBLIC):
        server_public = _z85_key(os.environ[ENV_SERVER_PUBLIC], ENV_SERVER_PUBLIC)
    else:
        server_public = b""
    path = _url_path(address, "client_key")
    client_secret: bytes | None
    if path is not None:
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
        raise CurveKeyError(
            "a CURVE client needs the server's public key "
            f"(?server_key=FILE or {ENV_SERVER_PUBLIC})"
        )
    if client_secret is None:
        raise CurveKeyError(
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


_PUBLIC_BANNER = (
    "#   ****  Generated by transport keygen (pyzmq's ZPL certificate format)  ****\n"
    "#   ZeroMQ CURVE Public Certificate\n"
    "#   Exchange securely, or use a secure mechanism to verify the contents\n"
    "#   of this file after exchange. Store public certificates in your home\n"
    "#   directory, in the .curve subdirectory.\n\n"
)
_SECRET_BANNER = (
    "#   ****  Generated by transport keygen (pyzmq's ZPL certificate format)  ****\n"
    "#   ZeroMQ CURVE **Secret** Certificate\n"
    "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.\n\n"
)


def _write_new(path: str, text: str, mode: int, force: bool) -> None:
    """Create ``path`` with ``mode`` from the start, whatever the umask (O_EXCL: never through
    a file or link already there; ``force`` removes the old one first)."""
    if force:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits off (or left 0644 at 0666)
        os.write(fd, text.encode("ascii"))
    finally:
        os.close(fd)


def keygen(directory: str, names: list[str], *, force: bool = False) -> list[dict[str, str]]:
    """Create CURVE key pairs ``DIR/NAME.key`` (public, 0644) and ``DIR/NAME.key_secret`` (0600
    from its creation), whatever the umask. Every name is checked (``check_key_name``, no
    repeats) and, without ``force``, every file is checked absent before anything is created."""
    for name in names:
        check_key_name(name)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConnectError(f"key name {repeated[0]!r} is given more than once")
    if not force:
        for name in names:
            for path in (
                os.path.join(directory, f"{name}{ext}") for ext in (".key", ".key_secret")
            ):
                if os.path.lexists(path):
                    raise ConnectError(f"{path} exists (pass --force to replace it)")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    made = []
    for name in names:
        public, secret = zmq.curve_keypair()
        public_text, secret_text = public.decode("ascii"), secret.decode("ascii")
        public_file = os.path.join(directory, f"{name}.key")
        secret_file = os.path.join(directory, f"{name}.key_secret")
        body = f'metadata\ncurve\n    public-key = "{public_text}"\n'
        _write_new(
            secret_file,
            f'{_SECRET_BANNER}{body}    secret-key = "{secret_text}"\n',
            0o600,
            force,
        )
        _write_new(public_file, f"{_PUBLIC_BANNER}{body}", 0o644, force)
        made.append(
            {
                "name": name,
                "public_file": public_file,
                "secret_file": secret_file,
                "public_key": public_text,
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
