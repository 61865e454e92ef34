"""The runtime a server serves: this process's, and with `replicas` > 1 the others beside it, one per GPU.

- Its embeddings: the configured embedding model (loading.load_embeddings), in this process.

- Replicas run in processes of their own (ProcessReplica, running replica_worker.serve_replica) or, where
  `config.ray` names a cluster, as Ray actors (ray_replicas.py).
- Each takes the pool and tier sizes this process's runtime took (loading.load).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from quail.engine.model.config import EngineConfig
from quail.engine.runtime.loading import load, load_embeddings, replica_device
from quail.engine.runtime.replica_worker import serve_replica
from quail.engine.runtime.replicas import ProcessReplica, Replica, Replicas
from quail.engine.runtime.runtime import Runtime


def serve_runtime(config: EngineConfig | None = None) -> Runtime:
    """This process's runtime (loading.load_runtime), with its replicas started beside it where the config
    asks for more than one."""
    runtime, sized = load(config)
    runtime.embeddings = load_embeddings(sized)
    if sized.replicas > 1:
        runtime.replicas = Replicas(*_remote(sized))
    return runtime


def _remote(config: EngineConfig) -> tuple[list[Replica], Callable[[], None]]:
    """Replicas 1..n-1 (not started yet), and what to call once they stopped."""
    if config.ray is None:
        return [ProcessReplica(i, replace(config, device=replica_device(config.device, i), replicas=1), serve_replica)
                for i in range(1, config.replicas)], lambda: None
    from quail.engine.runtime import ray_replicas  # Ray is an optional extra

    return ray_replicas.replicas(config, config.replicas), ray_replicas.disconnect
