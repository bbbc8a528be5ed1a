"""Where the Redis queue keeps each thing: every key name, under one prefix.

The prefix separates deployments that share a Redis and gives each test its own namespace. What
each key holds is tabled in qlm/queue/README.md; a record's hash fields are listed in
qlm/queue/redis/lua/scripts.py.
"""

from __future__ import annotations


class Keys:
    """Every key the queue uses, under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.queued = f"{prefix}queued"  # zset: id -> arrival sequence
        self.leases = f"{prefix}leases"  # zset: id -> lease expiry (caller's clock)
        self.seq = f"{prefix}seq"  # counter: arrival sequence
        self.counts = f"{prefix}counts"  # hash: state -> count
        self.changes = f"{prefix}changes"  # stream: one entry per change (wait_for_change)
        self.epoch = f"{prefix}epoch"  # counter: plan epochs
        self.plan = f"{prefix}plan"  # hash: epoch, json
        self.plan_changes = f"{prefix}plan-changes"  # stream: one entry per published epoch
        self.instances = f"{prefix}instances"  # hash: instance id -> status JSON
        self.tenants = f"{prefix}tenants"  # hash: tenant -> QUEUED requests (none at 0)
        self.leader = f"{prefix}leader"  # string: node id, with PX expiry

    def listed(self, tenant: str | None) -> str:
        """zset: id -> arrival sequence, every request's (None) or one tenant's; trimmed to
        the newest `max_listed_requests`, expired records removed when a listing meets them."""
        return f"{self.prefix}listed" if tenant is None else f"{self.prefix}listed:{tenant}"

    def record(self, request_id: str) -> str:
        return f"{self.prefix}r:{request_id}"  # hash, fields in qlm/queue/redis/lua/scripts.py

    def stream(self, request_id: str) -> str:
        return f"{self.prefix}s:{request_id}"  # stream of output events

    @property
    def stream_pattern(self) -> str:
        """The PSUBSCRIBE pattern matching every request's stream channel."""
        return f"{self.prefix}s:*"
