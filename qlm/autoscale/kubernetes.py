"""Pool replicas as StatefulSet scale, through the Kubernetes API (the official client).

`StatefulSetReplicas` is the `ReplicaSetter` (qlm/serve/pool_scaling.py) of `qlm controller` with
`controller.kubernetes_scaling`: it reads and merge-patches the `scale` subresource of each
autoscaled pool's StatefulSet (`qlm.autoscale.pools[].statefulset`), the one permission the
chart's `rbac.allowScaling` grants (get, patch and update of statefulsets/scale, for this
release's pools only). Calls run in a worker thread: the client is synchronous.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qlm.config import AutoscaleConfig

log = logging.getLogger("qlm.scaling")
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
MERGE_PATCH = "application/merge-patch+json"


class StatefulSetReplicas:
    def __init__(self, api: Any, namespace: str, statefulsets: Mapping[str, str]) -> None:
        """api: a kubernetes.client.AppsV1Api; statefulsets: pool name -> StatefulSet name."""
        self.api = api
        self.namespace = namespace
        self.statefulsets = dict(statefulsets)

    async def replicas(self, pool: str) -> int | None:
        name = self.statefulsets.get(pool)
        if name is None:
            return None
        scale = await asyncio.to_thread(
            self.api.read_namespaced_stateful_set_scale, name, self.namespace
        )
        spec = scale.spec
        return None if spec is None or spec.replicas is None else int(spec.replicas)

    async def set_replicas(self, pool: str, replicas: int) -> None:
        name = self.statefulsets.get(pool)
        if name is None:
            return
        await asyncio.to_thread(
            self.api.patch_namespaced_stateful_set_scale,
            name,
            self.namespace,
            {"spec": {"replicas": replicas}},
            _content_type=MERGE_PATCH,
        )
        log.info("statefulset %s/%s scaled to %d", self.namespace, name, replicas)


def in_cluster(config: AutoscaleConfig, namespace: str | None) -> StatefulSetReplicas:
    """The setter for the pods' own cluster (service-account credentials); ValueError when a
    pool names no StatefulSet or the namespace is unknown, ImportError without the client."""
    from kubernetes import client
    from kubernetes import config as kube_config

    missing = [p.name for p in config.pools if p.statefulset is None]
    if missing:
        raise ValueError(
            f"controller.kubernetes_scaling: autoscale pool {missing[0]} names no statefulset"
        )
    if namespace is None:
        if not NAMESPACE_FILE.exists():
            raise ValueError(
                "controller.kubernetes_scaling: set controller.kubernetes_namespace (not in a "
                f"pod: {NAMESPACE_FILE} is missing)"
            )
        namespace = NAMESPACE_FILE.read_text().strip()
    kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    names = {p.name: p.statefulset for p in config.pools if p.statefulset is not None}
    return StatefulSetReplicas(client.AppsV1Api(), namespace, names)
