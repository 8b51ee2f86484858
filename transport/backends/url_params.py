"""URL query parameters, read once for every backend: a parameter given twice is refused.

``parse_qsl`` and ``dict`` keep the last of ``?heartbeat=1&heartbeat=0`` silently; a URL that
says two things is a mistake, so it is a ``ConnectError`` naming the parameter (the Node side,
node_bridge/src/backends/url_params.ts, says the same).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from transport.errors import ConnectError


def single_params(url: str, query: str) -> dict[str, str]:
    """The parameters of ``query`` (the text after ``?``), each given at most once."""
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key in params:
            raise ConnectError(f"{url!r}: parameter {key!r} is given more than once")
        params[key] = value
    return params
