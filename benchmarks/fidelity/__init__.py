"""Simulator fidelity against real vLLM (issue 7): profile the tiny vLLM-CPU models with
`qlm profile`'s machinery, replay the same workloads through the live control plane (real
vLLM engines) and through the simulator (the fitted profiles), and compare per-request TTFT
and end-to-end latency, SLO attainment, and the estimator's predicted waits. Writes
docs/fidelity.md, its plots under docs/fidelity/, the fitted profiles and one scenario file
per run (so `qlm simulate docs/fidelity/scenarios/RUN.yaml` replays a run's workload), and
benchmarks/results/fidelity.json.

    .venv/bin/python -m benchmarks.fidelity            # the full benchmark (~20 min here)
    .venv/bin/python -m benchmarks.fidelity --quick    # one model, one run (a few minutes)

Needs .venv-vllm (scripts/install_vllm.sh). Method (docs/fidelity.md repeats it):

1. Build the tiny models (tests/vllm_fixtures.py) and profile each with VllmProfiler, the
   engine settings the live runs use (8 sequences, 4096-token context, 64 MiB KV cache,
   2048-token budget, no prefix caching: the simulator does not model prefix caching, and the
   live engine's synthetic prompts would otherwise share prefixes by chance).
2. Per run, a Poisson workload (rate = a fraction of the capacity the fitted profile predicts,
   lengths drawn from the Azure 2023 conversation trace with prompts <= 1536 and outputs
   capped at 256 tokens, interactive and batch classes) is generated once from a scenario file.
3. Live: the in-process control plane (running_plane: in-memory queue, the control loop, one
   agent per vLLM engine; no HTTP API, requests are enqueued with exact token counts at their
   arrival times). Per-request times come from the queue's records.
4. Simulated: the same requests (the live arrival times) through `simulate(..., "qlm")` on
   the scenario's fleet, which reads the fitted profile files; the simulated control loop is
   set like the live one (tick, re-plan gap, the live planner's median solve time).
5. Compare, and record the host's load average and CPU use for every phase.

Modules: settings (the runs, engine settings and where a run writes), host (CPU use per
phase), profiles (profiling and re-fitting the step model), scenarios (each run's workload
and live plane), outcomes (per-request times, either path), live (the live run), simulated
(the simulated run), comparison (live against simulated), estimator (predicted against
actual waits), plots, tables, results (the results file), docs (docs/fidelity.md), main
(the command line and the order of the phases).
"""
