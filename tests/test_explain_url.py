"""A client error names its URL once: a channel's text naming the URL without its query
(``shm://name``) is not prefixed again with ``shm://name?num_envs=4`` (exploration 22)."""

from __future__ import annotations

from transport.client import explain
from transport.errors import PeerGoneError


def test_a_url_named_without_its_query_is_not_repeated() -> None:
    error = explain(PeerGoneError("shm://run7: the server (pid 12) died"), "shm://run7?num_envs=4")
    assert str(error).startswith("shm://run7: the server (pid 12) died (")
    assert str(error).count("shm://run7") == 1


def test_a_text_without_the_url_gets_it() -> None:
    error = explain(PeerGoneError("the connection was closed"), "unix:///tmp/a.sock")
    assert str(error).startswith("unix:///tmp/a.sock: the connection was closed (")
