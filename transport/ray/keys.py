"""CURVE keys for Ray-placed env servers, kept out of every file system.

Each side makes its own key pair and only public keys move: the trainer's public key goes to the
actors as a constructor argument, each actor's public key comes back as the return value of
``endpoint()`` (both through Ray). Secrets never leave the process that made them.

transport reads keys from certificate files named in the URL (``?server_key=FILE``,
``?client_key=FILE``, docs/zmq.md). Here those "files" are anonymous memory files
(``memfd_create``): ``/proc/self/fd/N`` exists only inside this process (and in a child that is
handed the descriptor), is never linked into a directory, and is closed as soon as the server or
client has read it. Without memfd (not Linux) a 0600 file in a private 0700 directory stands in,
removed right after use.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import zmq

ENV_ALLOWED_CLIENTS = "TRANSPORT_ZMQ_ALLOWED_CLIENTS"
"""Z85 public keys a zmq+tcp server admits (docs/zmq.md): public, so an environment variable."""


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair as Z85 text. ``repr`` never shows the secret."""

    public: str
    secret: str

    @classmethod
    def generate(cls) -> KeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public.decode("ascii"), secret.decode("ascii"))

    def __repr__(self) -> str:
        return f"KeyPair(public={self.public!r}, secret=<hidden>)"


@dataclass(frozen=True)
class KeyFile:
    """A certificate readable at ``path`` while open; ``fd`` is its descriptor (-1: a real file)."""

    path: str
    fd: int


def certificate_text(public: str, secret: str | None = None) -> bytes:
    """The ZPL certificate pyzmq's ``load_certificate`` and the Node side both read."""
    lines = ["curve", f'    public-key = "{public}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret}"')
    return ("\n".join(lines) + "\n").encode("ascii")


@contextmanager
def key_file(public: str, secret: str | None = None) -> Iterator[KeyFile]:
    """A certificate that lives only in memory for the duration of the ``with`` block."""
    text = certificate_text(public, secret)
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd: int = memfd_create("transport-curve", getattr(os, "MFD_CLOEXEC", 1))
        try:
            os.write(fd, text)
            yield KeyFile(f"/proc/self/fd/{fd}", fd)
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="transport-curve-")  # mode 0700
    try:
        path = os.path.join(directory, "key")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, text)
        finally:
            os.close(fd)
        yield KeyFile(path, -1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def client_url(url: str, server_public: str, client: KeyPair) -> Iterator[str]:
    """``url`` with this client's CURVE keys, usable by ``transport.connect`` inside the block."""
    with (
        key_file(server_public) as server_key,
        key_file(client.public, client.secret) as client_key,
    ):
        yield f"{url}?server_key={server_key.path}&client_key={client_key.path}"
