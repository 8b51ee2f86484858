"""Issue 17 item 8: a co-tenant that truncates a live shm:// region. Before, the server and the
client both died of SIGBUS and a 0-byte segment stayed in /dev/shm. Now a Python process maps
regions guarded (transport.native.guard): the client gets a PeerGoneError saying what
happened, a Python server stops with a line saying why and removes the segment. A Node process
cannot recover from SIGBUS (V8 offers no way); the Python client of a Node server still gets the
typed error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

import transport.api as api
from transport import native
from transport.backends.shm.region import parse_url
from transport.errors import PeerGoneError, TransportError

from .servers import ServerProcess, require_lang


def truncate(path: str) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def unlink(url: str) -> None:
    try:
        native.shm_unlink(parse_url(url).segment)
    except FileNotFoundError:
        pass


@pytest.mark.parametrize("lang", ["python", "node"])
def test_a_truncated_region_is_a_typed_error_not_a_sigbus(lang: str) -> None:
    require_lang(lang)
    url = f"shm://test-{uuid.uuid4().hex[:12]}"
    path = parse_url(url).path
    server = ServerProcess(url, lang=lang)
    try:
        with api.connect(server.url, timeout=5) as client:
            client.reset(seed=1)
            client.step(0)
            truncate(path)
            with pytest.raises(PeerGoneError, match=r"truncated .* under this client"):
                client.step(0)  # writes the action into the lost slot first: the SIGBUS case
            with pytest.raises(TransportError):
                client.step(0)  # and stays an error
        rc = server.proc.wait(20)
        assert server.proc.stderr is not None
        err = server.proc.stderr.read()
        if lang == "python":
            assert rc == 1, err
            assert "another process truncated" in err and "the server stops" in err, err
            assert not os.path.exists(path), "the Python server removes the truncated segment"
        else:
            assert rc != 0  # Node dies of SIGBUS: documented in docs/shm.md
    finally:
        server.kill()
        unlink(url)


def test_a_sigbus_outside_a_guarded_region_still_ends_the_process(tmp_path: object) -> None:
    """The handler only takes faults inside guarded mappings; any other SIGBUS keeps its
    previous disposition (here the default: the process dies of it)."""
    script = textwrap.dedent(
        """
        import mmap, os, tempfile
        from transport import native
        guarded = mmap.mmap(-1, 4096)
        assert native.guard(guarded) >= 0
        with tempfile.TemporaryFile() as fh:
            fh.truncate(8192)
            other = mmap.mmap(fh.fileno(), 8192)
            fh.truncate(0)
            other[4096] = 1  # SIGBUS: not a guarded mapping
        print("survived")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -7, (proc.returncode, proc.stdout, proc.stderr)
    assert "survived" not in proc.stdout


def test_the_guard_survives_a_library_that_takes_sigbus_after_it() -> None:
    """CI found it: in the full suite a library enabled faulthandler (which takes SIGBUS) after
    the first region was guarded, and a truncation killed pytest. A guard added later puts the
    handler back on top (faulthandler becomes the previous disposition)."""
    script = textwrap.dedent(
        """
        import faulthandler, mmap, os, tempfile
        from transport import native
        first = mmap.mmap(-1, 4096)
        native.guard(first)               # the handler is installed
        faulthandler.enable()             # a library takes SIGBUS over it
        with tempfile.TemporaryFile(dir="/dev/shm") as fh:
            fh.truncate(8192)
            region = mmap.mmap(fh.fileno(), 8192)
            handle = native.guard(region)  # a region connected later
            fh.truncate(0)
            region[4096] = 1               # SIGBUS inside the guarded region
            print("lost", native.guard_lost(handle))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "lost True" in proc.stdout
