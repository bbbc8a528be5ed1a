"""The global queue's domain: request groups, grouping policies and (later) queue adapters."""

from qlm.queue.group import RequestGroup

__all__ = ["RequestGroup"]
