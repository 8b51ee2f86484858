"""A Ray cluster of several nodes on this machine, on loopback only (tests, benchmarks, trying out).

``local_cluster(nodes=3)`` starts ``ray.cluster_utils.Cluster`` with every node's address set to
127.0.0.1, connects this process to it, and on exit disconnects, stops every node and removes the
private directory that held Ray's sessions (``RAY_TMPDIR`` while it runs). Ray's usage-stats
reporting is turned off for it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LOOPBACK = "127.0.0.1"
OBJECT_STORE_BYTES = 100 << 20
"""Each simulated node's object store (Ray's minimum is 75 MiB; the default is 30% of RAM)."""


def use_loopback() -> None:
    """Make Ray (in this process and the nodes it starts) take 127.0.0.1 as the node address.

    Ray otherwise resolves "127.0.0.1" in a bootstrap address to the machine's outward address.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray: "local IP is loopback"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # Ray already imported: it read the variable at import time
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


def add_node(cluster: Any, num_cpus: float = 2, **node_args: Any) -> Any:
    """Add a loopback node to ``cluster`` (a small object store) and return it."""
    return cluster.add_node(
        num_cpus=num_cpus,
        node_ip_address=LOOPBACK,
        object_store_memory=OBJECT_STORE_BYTES,
        **node_args,
    )


@contextmanager
def local_cluster(nodes: int = 3, num_cpus: float = 2, **head_args: Any) -> Iterator[Any]:
    """A connected ``ray.cluster_utils.Cluster`` of ``nodes`` nodes (``num_cpus`` logical each).

    Node k > 0 has the custom resource ``node{k}`` = 1 (to pin actors in tests).
    """
    use_loopback()
    import ray
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="tr-ray-")
    previous_tmpdir = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir  # sessions and Ray's address file, all in here
    os.makedirs(os.path.join(temp_dir, "ray"))
    head = {
        "num_cpus": num_cpus,
        "include_dashboard": False,
        "node_ip_address": LOOPBACK,
        "object_store_memory": OBJECT_STORE_BYTES,
        **head_args,
    }
    cluster: Any = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args=head)
        for k in range(1, nodes):
            add_node(cluster, num_cpus, resources={f"node{k}": 1})
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        try:
            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
            if previous_tmpdir is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = previous_tmpdir
