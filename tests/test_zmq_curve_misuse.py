"""CURVE keys misused or broken, against real `transport-serve` processes (``lang`` python and
node) and both clients (Python in process, Node in a child process).

The URL's ``clients=DIR`` replaces the environment's allow list; an allow list without a server
key pair is refused (it would serve without CURVE); empty key parameters are errors; every bad
key (length, alphabet, range, a directory, a missing file, a public key that is not its
secret's, a secret file others may read) is one clean line in both languages' words, exit 1
for the server and a ``ConnectError`` without the "is a server serving" hint for a client; a
deterministic handshake failure fails connect at once; keygen's file modes and its checks
before it creates anything.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import transport.api as api
from transport.backends import zmq as zmq_backend
from transport.errors import ConnectError

from .servers import LANGS, ROOT, free_port, require_lang

NODE_INDEX = ROOT / "node_bridge" / "dist" / "index.js"
SERVING_HINT = "is a server serving"
SLOW = 5.0  # a deterministic failure takes well under a second; the connect timeout is 30 s

NODE_CONNECT = """
const { connect, ConnectError } = require(process.argv[1]);
(async () => {
  const started = Date.now();
  try {
    const client = await connect(process.argv[2], { timeoutMs: Number(process.argv[3]) });
    await client.close();
    console.log(JSON.stringify({ ok: true }));
  } catch (e) {
    const seconds = (Date.now() - started) / 1000;
    const name = e instanceof ConnectError ? "ConnectError" : e.constructor.name;
    console.log(JSON.stringify({ ok: false, name, message: String(e.message), seconds }));
  }
})();
"""


def keygen(
    directory: Path, *args: str, umask: int | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "transport.backends.zmq", "keygen", str(directory), *args]
    before = os.umask(umask) if umask is not None else None
    try:
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
    finally:
        if before is not None:
            os.umask(before)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    done = keygen(tmp_path, "--name", "server", "--name", "client", "--name", "other")
    assert done.returncode == 0, done.stderr
    clients = tmp_path / "clients"
    clients.mkdir(mode=0o755)
    shutil.copyfile(tmp_path / "client.key", clients / "client.key")
    return tmp_path


def public_key(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.strip().startswith("public-key"):
            return line.split('"')[1]
    raise AssertionError(f"no public key in {path}")


def secret_key(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.strip().startswith("secret-key"):
            return line.split('"')[1]
    raise AssertionError(f"no secret key in {path}")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSPORT_ZMQ_")}
    env.update(extra)
    return env


def serve_once(url: str, lang: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A server that must not start: its exit status and stderr."""
    require_lang(lang)
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "echo"]
    return subprocess.run(
        [*command, "--lang", lang],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(**env),
    )


@contextmanager
def serving(url: str, lang: str, **env: str) -> Iterator[str]:
    """A server that must start: yields its ready URL."""
    require_lang(lang)
    command = [sys.executable, "-m", "transport.tools.serve_cli", url, "--env", "echo"]
    proc = subprocess.Popen(
        [*command, "--lang", lang],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(**env),
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        selector = selectors.DefaultSelector()
        selector.register(proc.stdout, selectors.EVENT_READ)
        assert selector.select(20), "no ready line within 20 s"
        line = proc.stdout.readline()
        assert line.startswith("ready "), line + proc.stderr.read()
        yield line.split(" ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def port_of(url: str) -> int:
    return int(url.split("?", 1)[0].rsplit(":", 1)[1])


def node_connect(url: str, timeout: float = 30.0, **env: str) -> dict[str, object]:
    require_lang("node")
    done = subprocess.run(
        ["node", "-e", NODE_CONNECT, str(NODE_INDEX), url, str(int(timeout * 1000))],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        env=clean_env(**env),
    )
    got: dict[str, object] = json.loads(done.stdout or "{}")
    assert got, done.stdout + done.stderr
    return got


def python_connect(url: str, timeout: float = 30.0, **env: str) -> dict[str, object]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("TRANSPORT_ZMQ_")}
    for name in saved:
        del os.environ[name]
    os.environ.update(env)
    started = time.monotonic()
    try:
        with api.connect(url, timeout=timeout):
            return {"ok": True}
    except ConnectError as exc:
        seconds = time.monotonic() - started
        return {"ok": False, "name": "ConnectError", "message": str(exc), "seconds": seconds}
    finally:
        for name in env:
            os.environ.pop(name, None)
        os.environ.update(saved)


CLIENTS = {"python": python_connect, "node": node_connect}


# -- 1. the URL's clients= replaces the environment's allow list ---------------------------------


@pytest.mark.parametrize("lang", LANGS)
def test_url_clients_replace_the_environment_allow_list(keys: Path, lang: str) -> None:
    url = f"zmq+tcp://127.0.0.1:0?server_key={keys}/server.key_secret&clients={keys}/clients"
    other_public = public_key(keys / "other.key")
    env = {zmq_backend.ENV_ALLOWED_CLIENTS: other_public}
    with serving(url, lang, **env) as ready:
        base = f"zmq+tcp://127.0.0.1:{port_of(ready)}?server_key={keys}/server.key"
        assert python_connect(f"{base}&client_key={keys}/client.key_secret")["ok"]
        refused = python_connect(f"{base}&client_key={keys}/other.key_secret")
        assert not refused["ok"] and "refused this client's CURVE key" in str(refused["message"])


@pytest.mark.parametrize("lang", LANGS)
def test_environment_allow_lists_still_add_up_without_a_url_clients(keys: Path, lang: str) -> None:
    env = {
        zmq_backend.ENV_CLIENTS_DIR: str(keys / "clients"),
        zmq_backend.ENV_ALLOWED_CLIENTS: public_key(keys / "other.key"),
    }
    with serving(f"zmq+tcp://127.0.0.1:0?server_key={keys}/server.key_secret", lang, **env) as url:
        base = f"zmq+tcp://127.0.0.1:{port_of(url)}?server_key={keys}/server.key"
        for name in ("client", "other"):
            assert python_connect(f"{base}&client_key={keys}/{name}.key_secret")["ok"]


# -- 2. an allow list without a server key, empty key parameters ---------------------------------

NO_KEY_PAIR = (
    "admits clients by their CURVE keys, but this server has no key pair "
    "(?server_key=DIR/server.key_secret or TRANSPORT_ZMQ_SERVER_SECRET): it would serve without "
    "CURVE"
)


@pytest.mark.parametrize("lang", LANGS)
def test_an_allow_list_without_a_server_key_is_refused(keys: Path, lang: str) -> None:
    port = free_port()
    for url, env, first in [
        (f"zmq+tcp://127.0.0.1:{port}?clients={keys}/clients", {}, "?clients=DIR"),
        (
            f"zmq+tcp://127.0.0.1:{port}",
            {zmq_backend.ENV_ALLOWED_CLIENTS: public_key(keys / "client.key")},
            "TRANSPORT_ZMQ_ALLOWED_CLIENTS",
        ),
    ]:
        done = serve_once(url, lang, **env)
        assert done.returncode == 1, done.stderr
        assert done.stderr == f"transport-serve: error: {first} {NO_KEY_PAIR}\n"
    done = serve_once(f"zmq+tcp://127.0.0.1:{port}?server_key=&clients={keys}/clients", lang)
    assert done.returncode == 1
    assert done.stderr == (
        "transport-serve: error: ?server_key= is empty: give a path (percent-encoded), or leave "
        "the parameter out\n"
    )


@pytest.mark.parametrize("client", ["python", "node"])
@pytest.mark.parametrize("name", ["server_key", "client_key"])
def test_an_empty_key_parameter_is_an_error_for_a_client(
    keys: Path, client: str, name: str
) -> None:
    other = "client_key" if name == "server_key" else "server_key"
    other_file = keys / ("client.key_secret" if other == "client_key" else "server.key")
    got = CLIENTS[client](f"zmq+tcp://127.0.0.1:1?{name}=&{other}={other_file}", timeout=5)
    assert not got["ok"] and got["name"] == "ConnectError"
    message = str(got["message"])
    assert f"?{name}= is empty: give a path (percent-encoded)" in message
    assert SERVING_HINT not in message


# -- 3, 5. bad key material: one line, the same words, exit 1 -------------------------------------


def bad_server_cases(keys: Path) -> list[tuple[str, str, dict[str, str], str]]:
    """(case, URL query, environment, the error's text) for a server that must not start."""
    secret = keys / "server.key_secret"
    truncated = keys / "truncated.key_secret"
    fd = os.open(truncated, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret.read_bytes()[:300])
    os.close(fd)
    odd = keys / "odd"
    (odd / "x.key").mkdir(parents=True)
    shutil.copyfile(keys / "client.key", odd / "client.key")
    corrupt = keys / "corrupt"
    corrupt.mkdir()
    (corrupt / "x.key").write_text("garbage\n")
    tampered = keys / "tampered.key_secret"
    fd = os.open(tampered, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(
        fd, secret.read_text().replace(public_key(secret), public_key(keys / "other.key")).encode()
    )
    os.close(fd)
    clients = f"clients={keys}/clients"
    return [
        (
            "truncated secret",
            f"server_key={truncated}&{clients}",
            {},
            f"the secret key in {truncated} is not a 40-character Z85 CURVE key (wrong length)",
        ),
        (
            "directory named x.key",
            f"server_key={secret}&clients={odd}",
            {},
            f"cannot read the CURVE key file {odd}/x.key: Is a directory",
        ),
        (
            "corrupt key in the clients dir",
            f"server_key={secret}&clients={corrupt}",
            {},
            f"cannot read the CURVE key file {corrupt}/x.key: no public-key",
        ),
        (
            "missing key file",
            f"server_key={keys}/nope.key_secret&{clients}",
            {},
            f"cannot read the CURVE key file {keys}/nope.key_secret: No such file or directory",
        ),
        (
            "out-of-range env secret",
            clients,
            {zmq_backend.ENV_SERVER_SECRET: "#" * 40},
            "TRANSPORT_ZMQ_SERVER_SECRET is not a 40-character Z85 CURVE key (z85 group out of "
            "range)",
        ),
        (
            "env secret outside the alphabet",
            clients,
            {zmq_backend.ENV_SERVER_SECRET: "~" * 40},
            'TRANSPORT_ZMQ_SERVER_SECRET is not a 40-character Z85 CURVE key ("~" is not a z85 '
            "character)",
        ),
        (
            "public key not the secret's",
            f"server_key={tampered}&{clients}",
            {},
            f"the public key in {tampered} is not its secret key's (the file was changed: make a "
            "new pair with keygen)",
        ),
    ]


def test_bad_server_keys_are_one_line_exit_1_in_both_languages(keys: Path) -> None:
    port = free_port()
    for case, query, env, text in bad_server_cases(keys):
        for lang in LANGS:
            done = serve_once(f"zmq+tcp://127.0.0.1:{port}?{query}", lang, **env)
            assert (done.returncode, done.stderr) == (1, f"transport-serve: error: {text}\n"), (
                lang,
                case,
            )


@pytest.mark.parametrize("client", ["python", "node"])
def test_bad_client_keys_name_the_file_or_variable(keys: Path, client: str) -> None:
    truncated = keys / "short.key_secret"
    fd = os.open(truncated, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (keys / "client.key_secret").read_bytes()[:300])
    os.close(fd)
    server = f"server_key={keys}/server.key"
    secret = secret_key(keys / "client.key_secret")
    cases: list[tuple[str, dict[str, str], str]] = [
        (
            f"{server}&client_key={truncated}",
            {},
            f"the secret key in {truncated} is not a 40-character Z85 CURVE key (wrong length)",
        ),
        (
            f"{server}&client_key={keys}/missing.key_secret",
            {},
            f"cannot read the CURVE key file {keys}/missing.key_secret: No such file or directory",
        ),
        (
            server,
            {zmq_backend.ENV_CLIENT_SECRET: "#" * 40},
            "TRANSPORT_ZMQ_CLIENT_SECRET is not a 40-character Z85 CURVE key (z85 group out of "
            "range)",
        ),
        (
            server,
            {zmq_backend.ENV_CLIENT_SECRET: "~" + secret[1:]},
            'TRANSPORT_ZMQ_CLIENT_SECRET is not a 40-character Z85 CURVE key ("~" is not a z85 '
            "character)",
        ),
        (
            f"{server}&client_key={keys}/client.key",
            {},
            f"{keys}/client.key holds no secret key (use the .key_secret file)",
        ),
    ]
    for query, env, text in cases:
        got = CLIENTS[client](f"zmq+tcp://127.0.0.1:1?{query}", timeout=5, **env)
        assert not got["ok"] and got["name"] == "ConnectError", got
        assert str(got["message"]).endswith(text), got  # no "is a server serving" hint after it


# -- 6. file modes -------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
def test_a_secret_key_file_others_may_read_is_refused(keys: Path, lang: str) -> None:
    secret = keys / "server.key_secret"
    secret.chmod(0o640)
    done = serve_once(
        f"zmq+tcp://127.0.0.1:{free_port()}?server_key={secret}&clients={keys}/clients", lang
    )
    assert done.returncode == 1
    assert done.stderr == (
        f"transport-serve: error: {secret} holds a CURVE secret key but group or others may read "
        f"or change it (mode 0640): chmod 600 {secret}\n"
    )
    mine = keys / "client.key_secret"
    mine.chmod(0o604)
    got = CLIENTS[lang](
        f"zmq+tcp://127.0.0.1:1?server_key={keys}/server.key&client_key={mine}", timeout=5
    )
    assert not got["ok"]
    assert str(got["message"]).endswith(f"(mode 0604): chmod 600 {mine}")


@pytest.mark.parametrize("lang", LANGS)
def test_a_world_writable_admitted_key_is_refused(keys: Path, lang: str) -> None:
    admitted = keys / "clients" / "client.key"
    admitted.chmod(0o666)
    url = f"zmq+tcp://127.0.0.1:{free_port()}?server_key={keys}/server.key_secret&clients={keys}/clients"
    done = serve_once(url, lang)
    assert done.returncode == 1
    assert f"the CURVE key file {admitted} is writable by anyone (mode 0666)" in done.stderr


def test_keygen_modes_ignore_the_umask(tmp_path: Path) -> None:
    done = keygen(tmp_path / "k", "--name", "a", umask=0)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((tmp_path / "k" / "a.key_secret").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k" / "a.key").stat().st_mode) == 0o644
    done = keygen(tmp_path / "k", "--name", "a", "--force", umask=0o077)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((tmp_path / "k" / "a.key").stat().st_mode) == 0o644


# -- 7. deterministic handshake failures fail at once ---------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
def test_a_handshake_that_cannot_succeed_fails_connect_at_once(keys: Path, lang: str) -> None:
    url = f"zmq+tcp://127.0.0.1:0?server_key={keys}/server.key_secret&clients={keys}/clients"
    with serving(url, lang) as ready:
        port = port_of(ready)
        cases = {
            "NULL client, CURVE server": f"zmq+tcp://127.0.0.1:{port}",
            "wrong server key": f"zmq+tcp://127.0.0.1:{port}?server_key={keys}/other.key"
            f"&client_key={keys}/client.key_secret",
            "refused key": f"zmq+tcp://127.0.0.1:{port}?server_key={keys}/server.key"
            f"&client_key={keys}/other.key_secret",
        }
        for case, client_url in cases.items():
            for client, connect in CLIENTS.items():
                got = connect(client_url, timeout=30)
                assert not got["ok"] and got["name"] == "ConnectError", (case, client, got)
                assert float(str(got["seconds"])) < SLOW, (case, client, got)
                assert "handshake failed" in str(got["message"]) or "refused" in str(
                    got["message"]
                ), got
    with serving("zmq+tcp://127.0.0.1:0", lang) as ready:
        curve_client = (
            f"zmq+tcp://127.0.0.1:{port_of(ready)}?server_key={keys}/server.key"
            f"&client_key={keys}/client.key_secret"
        )
        for client, connect in CLIENTS.items():
            got = connect(curve_client, timeout=30)
            assert not got["ok"] and float(str(got["seconds"])) < SLOW, (client, got)


# -- 10. keygen checks every file before it creates any -------------------------------------------


def test_keygen_refuses_an_existing_public_key_and_repeated_names(tmp_path: Path) -> None:
    keys = tmp_path / "k"
    keys.mkdir()
    (keys / "b.key").write_text("mine\n")
    done = keygen(keys, "--name", "a", "--name", "b")
    assert done.returncode == 1
    assert f"{keys}/b.key exists (pass --force to replace it)" in done.stderr
    assert sorted(p.name for p in keys.iterdir()) == ["b.key"]
    assert (keys / "b.key").read_text() == "mine\n"
    done = keygen(keys, "--name", "x", "--name", "x")
    assert done.returncode == 1 and "'x' is given more than once" in done.stderr
    assert sorted(p.name for p in keys.iterdir()) == ["b.key"]
