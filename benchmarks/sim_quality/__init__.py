"""Simulator quality benchmark: every policy on QLM's workloads WA, WB and WC (sims/), SLO
attainment overall and per class, throughput, and the issue's bar (qlm >= edf >= fcfs and
qlm >= llmd on every scenario). Prints Markdown, writes results/sim_quality.json and the
sim-quality block of docs/benchmarks.md.

    .venv/bin/python -m benchmarks.sim_quality [--quick] [--scenarios wa,wb,wc]
        [--policies fcfs,edf,...] [--jobs N] [--seed N]
    .venv/bin/python -m benchmarks.sim_quality --calibrate [--quick]
    .venv/bin/python -m benchmarks.sim_quality --random N [--random-seed-base B] [--jobs N]
    .venv/bin/python -m benchmarks.sim_quality --seeds 0,1,7 [--quick] [--jobs N]

Every form takes --ray ADDRESS (or RAY_ADDRESS): the runs go to that Ray cluster as tasks
instead of --jobs local processes, with the same results (each run is qlm/sim/spread.py's
`run_policy`, as in a local process); --max-run-s is local only.

--quick runs the quick sizes (sims/X-quick.yaml); full and quick results are kept side by side
in the JSON and the docs block. --calibrate runs only fcfs at rate scales 1, 1.5, 2, 2.5, 3, 4
and reports the smallest at which fcfs attains < 75% (the rule the scenario files follow).

--random N runs every policy on N random scenarios (qlm/sim/fuzz, seeds B..B+N-1) and reports
qlm's margin over the best baseline (results/sim_quality_random.json, block sim-quality-random).

--seeds S1,S2,... runs every policy on the scenarios at each seed and keeps the seeds side by
side (results/sim_quality_seeds.json, block sim-quality-seeds) with a verdict table per scenario
and seed against the baselines (a plain run keeps one result per scenario, so a run with another
--seed replaces it).

Modules: runs (policies on scenarios in worker processes, and the load calibration), checks
(the issue's bar and where qlm is beaten), render (the docs block), main (the command line
and the results file that keeps full and quick runs side by side), fuzz (--random), seeds
(--seeds).
"""
