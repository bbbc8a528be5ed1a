"""Shared prompt prefixes, in one place: how a prompt is cut into blocks (prompt_blocks.py),
what an engine's prefix cache holds (cache.py, the engine model's) and the order it admits by
(local_order.py, Preble's), what routers believe each instance holds (index.py), the dispatch
locality built on that belief (affinity.py, both planes), the live plane's reports of it
(reports.py) and a batch job planned around its shared prefixes (job_plan.py, BatchLLM's).
The simulator's prefix workloads and its reuse report stay beside it (qlm/sim/workload/
prefixes.py, qlm/sim/report/prefix.py). README.md says who calls what."""
