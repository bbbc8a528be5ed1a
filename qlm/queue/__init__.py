"""Storage of the global queue: the GlobalQueue protocol, its records, and two adapters
(in-memory, Redis). Domain types (requests, groups, plans) live in qlm.types, qlm.grouping
and qlm.control.plan."""
