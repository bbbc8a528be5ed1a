"""Soak: hold a mixed interactive + batch load against the live control plane for minutes and
check that it stays healthy: resident memory flat, no errors but the expected 429s, and the
enqueue latency of the asynchronous API.

    .venv/bin/python -m benchmarks.soak               # 10 minutes; results + docs block
    .venv/bin/python -m benchmarks.soak --minutes 30
    .venv/bin/python -m benchmarks.soak --quick       # 10 s smoke; soak_quick.json, no docs

The plane runs as separate processes (`qlm api`, `qlm controller`, `qlm agent` for every
instance; `--setup serve` runs `qlm serve` instead) on examples/fleet.yaml's emulated mixed
fleet, sped up (`engine.speedup`), on a throwaway redis-server. The queue is bounded
(`queue.max_queued`, part of it reserved for interactive requests), and batch bursts overrun
it on purpose: those 429s are the expected errors; anything else counts as an error.

Load (open loop, Poisson arrivals, seeded): interactive streaming chat completions and
non-streaming completions, steady asynchronous batch-1/batch-2 submissions, and a burst of
batch-2 submissions every `--burst-every-s`. After the load, the plane drains and every
request it accepted must have completed (queue counts).

Memory: the resident set size of each qlm process (and redis-server) every `--sample-s`,
with psutil; the report gives it over time and a least-squares slope over the run after a
warm-up (the first 20 % of it): what a leak would show. Results: benchmarks/results/soak.json
and the soak block of docs/benchmarks.md.

Modules: options (the command line), plane (the plane's processes and fleet file), load (the
client traffic and what it saw), memory (resident memory over time and its slope), summary
(the verdict and the docs block), main (one soak run).
"""
