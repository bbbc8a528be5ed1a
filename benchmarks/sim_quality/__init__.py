"""Simulator quality benchmark: every policy on QLM's workloads WA, WB and WC (sims/), SLO
attainment overall and per class, throughput, and the issue's bar (qlm >= edf >= fcfs and
qlm >= llmd on every scenario). Prints Markdown, writes results/sim_quality.json and the
sim-quality block of docs/benchmarks.md.

    .venv/bin/python benchmarks/sim_quality.py [--quick] [--scenarios wa,wb,wc]
        [--policies fcfs,edf,...] [--jobs N] [--seed N]
    .venv/bin/python benchmarks/sim_quality.py --calibrate [--quick]

--quick runs the quick sizes (sims/X-quick.yaml); full and quick results are kept side by side
in the JSON and the docs block. --calibrate runs only fcfs at rate scales 1, 1.5, 2, 2.5, 3, 4
and reports the smallest at which fcfs attains < 75% (the rule the scenario files follow).

Modules: runs (policies on scenarios in worker processes, and the load calibration), checks
(the issue's bar and where qlm is beaten), render (the docs block), main (the command line
and the results file that keeps full and quick runs side by side).
"""
