"""Grouping policies. Importing this package registers the built-in ones."""

from qlm.grouping import exact_key, kmeans  # noqa: F401  (registration)
from qlm.grouping.grouping_base import GROUPING_POLICIES, GroupingPolicy, make_grouping

__all__ = ["GROUPING_POLICIES", "GroupingPolicy", "make_grouping"]
