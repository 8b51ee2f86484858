"""A local Ray cluster for a test module, or a skip saying why Ray cannot start here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def cluster_or_skip(**options: Any) -> Iterator[Any]:
    """Yield ``transport.ray.testing.local_cluster(**options)``'s cluster; any failure to start
    Ray is a skip reason. For a module-scoped ``cluster`` fixture: ``yield from`` it."""
    from transport.ray.testing import local_cluster

    try:
        manager = local_cluster(**options)
        ray_cluster = manager.__enter__()
    except Exception as exc:
        pytest.skip(f"Ray cannot start a local cluster here: {type(exc).__name__}: {exc}")
    try:
        yield ray_cluster
    finally:
        manager.__exit__(None, None, None)
