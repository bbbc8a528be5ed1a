"""k-means grouping (QLM Algorithm 1): cluster each model's requests by deadline slack and
token lengths, then split big clusters in half by ttft deadline. See README.md here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from qlm.config import GroupingConfig
from qlm.grouping.group import RequestGroup
from qlm.grouping.grouping_base import GROUPING_POLICIES
from qlm.grouping.partition import KeyRun, PartitionedGrouping, RequestColumns, split_planned
from qlm.types import Request

Features = NDArray[np.float64]  # rows of (log1p slack_s, log1p prompt_tokens, log1p output cap)


def request_features(columns: RequestColumns, reference_s: float) -> Features:
    """Feature rows of many requests. Fixed log scaling, so rows computed later for single
    inserts (`features_of`) are comparable with centroids fitted now."""
    slack_s = np.maximum(0.0, columns.ttft_deadline_at_s - reference_s)
    raw = np.column_stack((slack_s, columns.prompt_tokens, columns.max_output_tokens))
    features: Features = np.log1p(raw.astype(np.float64))
    return features


def features_of(request: Request, reference_s: float) -> Features:
    """The feature row of one request (same formula as `request_features`)."""
    slack_s = max(0.0, request.ttft_deadline_at_s - reference_s)
    return np.array(
        (
            math.log1p(slack_s),
            math.log1p(request.prompt_tokens),
            math.log1p(request.max_output_tokens),
        )
    )


def num_clusters(features: Features, config: GroupingConfig) -> int:
    """k = min(max_clusters_per_model, ceil(n / requests_per_cluster), distinct rows), >= 1."""
    cap = min(config.max_clusters_per_model, math.ceil(len(features) / config.requests_per_cluster))
    if cap <= 1:
        return 1
    return min(cap, _num_distinct_rows(features))


def _num_distinct_rows(features: Features) -> int:
    rows = features[np.lexsort(features.T)]
    return 1 + int(np.count_nonzero(np.any(rows[1:] != rows[:-1], axis=1)))


@dataclass(frozen=True, slots=True)
class Clusters:
    """One model's clustering. Cluster c has centroid centroids[c]; clusters are numbered by
    centroid (slack first), so k0 is the most urgent."""

    labels: NDArray[np.intp]  # one per feature row
    centroids: Features

    @property
    def sizes(self) -> list[int]:
        sizes: list[int] = np.bincount(self.labels, minlength=len(self.centroids)).tolist()
        return sizes


def fit_clusters(features: Features, config: GroupingConfig) -> Clusters:
    """Seeded k-means (Lloyd, one k-means++ start) over one model's feature rows."""
    k = num_clusters(features, config)
    if k == 1:
        return Clusters(
            np.zeros(len(features), dtype=np.intp), features.mean(axis=0, keepdims=True)
        )
    model = KMeans(
        n_clusters=k, n_init=1, max_iter=config.max_kmeans_iter, random_state=config.seed
    ).fit(features)
    centroids: Features = model.cluster_centers_
    by_centroid = np.lexsort(centroids.T[::-1])
    rank = np.empty(k, dtype=np.intp)
    rank[by_centroid] = np.arange(k)
    return Clusters(rank[model.labels_], centroids[by_centroid])


def nearest_cluster(centroids: Features, row: Features) -> int:
    return int(np.argmin(((centroids - row) ** 2).sum(axis=1)))


def cluster_key(model: str, cluster: int) -> tuple[str, str]:
    return (model, f"k{cluster}")


@GROUPING_POLICIES.register("kmeans")
class KMeansGrouping(PartitionedGrouping):
    """k-means per model, big clusters halved by ttft deadline; inserts join the nearest
    centroid of their model until `needs_regroup` asks for a re-cluster."""

    def __init__(self, config: GroupingConfig) -> None:
        super().__init__(config)
        self._centroids: dict[str, Features] = {}
        self._reference_s = 0.0  # `now_s` of the last regroup; slack is measured from it

    def regroup(self, requests: Sequence[Request], now_s: float) -> tuple[RequestGroup, ...]:
        rest, planned = split_planned(requests)
        columns = RequestColumns.of(rest)
        order = columns.order(columns.model_codes)
        runs, centroids = self._cluster_models(columns, request_features(columns, now_s), order)
        self._centroids = centroids
        self._reference_s = now_s
        return self._load(rest, columns, order, runs, planned)

    def _cluster_models(
        self, columns: RequestColumns, features: Features, order: NDArray[np.intp]
    ) -> tuple[list[KeyRun], dict[str, Features]]:
        """Cluster each model's rows; reorders `order` in place (each model's slice becomes
        cluster by cluster, deadline order within a cluster). One BLAS/OpenMP thread: as fast
        on 3 features and immune to the stalls OpenMP suffers when cores are oversubscribed."""
        runs: list[KeyRun] = []
        centroids: dict[str, Features] = {}
        sizes = np.bincount(columns.model_codes, minlength=len(columns.models))
        stops = np.cumsum(sizes)
        with threadpool_limits(limits=1):
            for model, start, stop in zip(
                columns.models, (stops - sizes).tolist(), stops.tolist(), strict=True
            ):
                rows = order[start:stop]
                clusters = fit_clusters(features[rows], self._config)
                order[start:stop] = rows[np.argsort(clusters.labels, kind="stable")]
                runs += [(cluster_key(model, c), n) for c, n in enumerate(clusters.sizes)]
                centroids[model] = clusters.centroids
        return runs, centroids

    def add(self, request: Request) -> str:
        """Join the nearest centroid of the request's model (a new model gets a cluster seeded
        at the request). Before any regroup every model has one cluster, so the reference
        time does not matter then."""
        if request.job_group is not None:  # a planned job's part keeps its own group
            return self._add(request, (request.model, ""))
        row = features_of(request, self._reference_s)
        centroids = self._centroids.get(request.model)
        cluster = 0 if centroids is None else nearest_cluster(centroids, row)
        group_id = self._add(request, cluster_key(request.model, cluster))
        if centroids is None:
            self._centroids[request.model] = row[np.newaxis, :]
        return group_id
