"""A real Ray cluster of several nodes on 127.0.0.1, this process attached as its driver: the one way the
Ray tests (distributed builds, sharded serving) start Ray (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

# Without this (and the nodes' and driver's loopback address) Ray swaps 127.0.0.1 for the host's interface
# address and the nodes never join.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
NODE_ARGS: dict[str, Any] = {
    "num_cpus": 2,  # Ray Data stalls on smaller logical budgets
    "node_ip_address": "127.0.0.1",
    "object_store_memory": 80 * 1024 * 1024,
}


@contextlib.contextmanager
def loopback_cluster(nodes: int = 3) -> Iterator[Any]:
    """``nodes`` Ray nodes of 2 logical CPUs on 127.0.0.1 (the head one of them), ``ray.init`` connected to
    them; everything shut down and the environment restored on the way out."""
    patch = pytest.MonkeyPatch()
    for key, value in LOOPBACK_ENV.items():
        patch.setenv(key, value)
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # read when ray was first imported
    cluster = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**NODE_ARGS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        patch.undo()
