"""The grouping extension point: which requests are planned together?"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from qlm.config import GroupingConfig
from qlm.grouping.group import RequestGroup
from qlm.registry import Registry
from qlm.types import Request


class GroupingPolicy(Protocol):
    """Keeps queued requests partitioned into request groups.

    `regroup` clusters everything from scratch (the periodic rebalance); `add` places one new
    request without re-clustering; `remove` forgets a request (pulled, cancelled). `groups`
    returns the current partition: every request added and not removed is in exactly one
    group, and no group mixes models.

    `regroup`'s now_s is the reference for deadline slack until the next regroup. Errors:
    `remove` of an unknown id raises KeyError; `add` of an id already grouped, and `regroup`
    with duplicate ids, raise ValueError.
    """

    def regroup(self, requests: Sequence[Request], now_s: float) -> tuple[RequestGroup, ...]: ...

    def add(self, request: Request) -> str:
        """Place a request; returns the id of the group it joined."""
        ...

    def remove(self, request_id: str) -> None: ...

    def groups(self) -> tuple[RequestGroup, ...]: ...

    @property
    def needs_regroup(self) -> bool:
        """True when enough incremental inserts happened that a rebalance is due."""
        ...


GROUPING_POLICIES: Registry[GroupingPolicy] = Registry("grouping")


def make_grouping(config: GroupingConfig) -> GroupingPolicy:
    """Build the grouping policy the configuration names."""
    return GROUPING_POLICIES.create(config.policy, config)
