"""Planner benchmark: the MILP planner (CP-SAT, CBC, HiGHS) against EDF on heterogeneous
fleets, then the grouping benchmark. Prints Markdown, writes results/solver.json and the
solver block of docs/benchmarks.md.

    .venv/bin/python -m benchmarks.solver [--quick] [--repeats N]

Fleets: half A10 (24 GiB), the rest A100 (80 GiB; some with two GPUs) and a few H100.
Models: mistral-7b (fits everything), vicuna-13b (A100/H100 only), llama-70b (two A100s).
Groups: 10-250 requests, mixed SLO classes, deadlines from already late to well ahead.

Modules: inputs (the synthetic fleets, profiles and groups), runs (each planner on each
input, and the grouping benchmark), targets (summaries and PASS / MISS), render (the docs
block), main (the command line).
"""
