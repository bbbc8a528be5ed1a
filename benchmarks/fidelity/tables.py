"""The report's tables as Markdown lines: errors against the targets, attainment and where the
time goes, the fitted and re-measured step models, the estimator, the host's load; and the
runs that missed a target."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from benchmarks.fidelity.comparison import Comparison
from benchmarks.fidelity.estimator import EstimatorCheck
from benchmarks.fidelity.host import HostSample
from benchmarks.fidelity.outcomes import LiveRun
from benchmarks.fidelity.settings import TARGET_E2E_P50, TARGET_TTFT_P50
from qlm.config.profile_files import ProfileFile
from qlm.engine.profiling.measured import ProfileFit


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def _s(x: float) -> str:
    return "n/a" if math.isnan(x) else (f"{x:.3f}" if x < 10 else f"{x:.1f}")


def error_table(comparisons: Sequence[Comparison]) -> list[str]:
    head = (
        "| run | simulator's profile | requests | TTFT p50 live / sim (s) | err | TTFT p90 err "
        "| TTFT p99 err | e2e p50 live / sim (s) | err | e2e p90 err | e2e p99 err "
        "| per-request median err TTFT / e2e |"
    )
    lines = [head, "|" + "---|" * 12]
    for c in comparisons:
        lines.append(
            f"| {c.run} | {c.profile} | {c.requests} "
            f"| {_s(c.ttft_live['p50'])} / {_s(c.ttft_sim['p50'])} "
            f"| {_mark(c.error('ttft', 'p50'), TARGET_TTFT_P50)} | {pct(c.error('ttft', 'p90'))} "
            f"| {pct(c.error('ttft', 'p99'))} | {_s(c.e2e_live['p50'])} / {_s(c.e2e_sim['p50'])} "
            f"| {_mark(c.error('e2e', 'p50'), TARGET_E2E_P50)} | {pct(c.error('e2e', 'p90'))} "
            f"| {pct(c.error('e2e', 'p99'))} | {pct(c.ttft_paired_median_error)} / "
            f"{pct(c.e2e_paired_median_error)} |"
        )
    return lines


def _mark(err: float, target: float) -> str:
    if math.isnan(err):
        return "n/a"
    return f"**{pct(err)}**" if err > target else pct(err)


def attainment_table(comparisons: Sequence[Comparison]) -> list[str]:
    lines = [
        "| run | profile | overall live / sim | interactive live / sim | batch-1 live / sim "
        "| swaps live / sim | evictions live / sim | median wait live / sim (s) "
        "| median first token - dispatch live / sim (s) | mean decode step: live engine / "
        "live as QLM saw it / sim (ms) |",
        "|" + "---|" * 10,
    ]
    for c in comparisons:
        cells = []
        for cls in ("overall", "interactive", "batch-1"):
            cells.append(
                f"{pct(c.attainment_live.get(cls, math.nan))} / "
                f"{pct(c.attainment_sim.get(cls, math.nan))}"
            )
        lines.append(
            f"| {c.run} | {c.profile} | {' | '.join(cells)} | {c.swaps_live} / {c.swaps_sim} "
            f"| {c.evictions_live} / {c.evictions_sim} | {_s(c.wait_p50_live_s)} / "
            f"{_s(c.wait_p50_sim_s)} | {_s(c.service_ttft_p50_live_s)} / "
            f"{_s(c.service_ttft_p50_sim_s)} | {_ms(c.itl_engine_live_s)} / "
            f"{_ms(c.itl_live_s)} / {_ms(c.itl_sim_s)} |"
        )
    return lines


def _ms(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{1e3 * x:.2f}"


def fit_table(fits: Mapping[str, tuple[ProfileFile, ProfileFit]]) -> list[str]:
    lines = [
        "| model | iterations | R^2 | max rel. error | rms rel. error | base (ms) | per prefill "
        "token (us) | per decode seq (us) | per context token (ns) | load (s) | request "
        "overhead (ms) |",
        "|" + "---|" * 11,
    ]
    for model, (spec, fit) in fits.items():
        q = fit.quality()
        st = fit.fit.step_time
        m = spec.measurement
        overhead = m.request_overhead_s if m is not None else None
        loads = ", ".join(f"{x:.0f}" for x in (m.load_s_samples if m else ()))
        lines.append(
            f"| {model} | {q.samples} | {q.r_squared or math.nan:.3f} "
            f"| {pct(q.max_relative_error)} "
            f"| {pct(q.rms_relative_error)} | {1e3 * st.base_s:.2f} "
            f"| {1e6 * st.per_prefill_token_s:.1f} | {1e6 * st.per_decode_seq_s:.1f} "
            f"| {1e9 * st.per_context_token_s:.1f} | {spec.load_s:.0f} ({loads}) "
            f"| {'n/a' if overhead is None else f'{1e3 * overhead:.1f}'} |"
        )
    return lines


def disagreement_table(comparisons: Sequence[Comparison]) -> list[str]:
    """Request by request: the requests only one plane missed, and where the live time went
    for those only live missed (comparison.Disagreements)."""
    causes = ("engine", "wait", "evicted", "unfinished")
    lines = [
        "| run | profile | met sim, missed live | of them: longer first token after dispatch "
        "/ longer wait / evicted / unfinished | of them, by model | their median extra time "
        "live: first token after dispatch / wait (s) | each model's first dispatch live / sim "
        "(s) | met live, missed sim |",
        "|" + "---|" * 8,
    ]
    for c in comparisons:
        d = c.disagreements
        if d is None:
            continue
        split = " / ".join(str(d.by_cause.get(k, 0)) for k in causes)
        models = ", ".join(f"{m} {n}" for m, n in sorted(d.by_model.items())) or "-"
        firsts = ", ".join(
            f"{m} {_s(live)} / {_s(sim)}" for m, (live, sim) in d.first_dispatch_s.items()
        )
        lines.append(
            f"| {c.run} | {c.profile} | {d.missed_live_only} | {split} | {models} "
            f"| {_s(d.extra_engine_p50_s)} / {_s(d.extra_wait_p50_s)} | {firsts} "
            f"| {d.missed_sim_only} |"
        )
    return lines


def refit_table(
    fits: Mapping[str, tuple[ProfileFile, ProfileFit]],
    refits: Mapping[str, ProfileFit],
    together: Mapping[str, ProfileFit] | None = None,
) -> list[str]:
    """The tiny-a step model up front and as re-measured before each run: alone, and with
    every engine of the fleet probed at once."""
    lines = [
        "| measured | iterations | R^2 | max rel. error | base (ms) | per prefill token (us) "
        "| per decode seq (us) | per context token (ns) | decode step, 8 x 1,000 tokens (ms) "
        "| prefill of 727 tokens (ms) |",
        "|" + "---|" * 10,
    ]
    rows: list[tuple[str, ProfileFit]] = []
    if "tiny-a" in fits:
        rows.append(("up front (the profile file)", fits["tiny-a"][1]))
    rows += [(f"before {run}", fit) for run, fit in refits.items()]
    rows += [(f"before {run}, every engine at once", f) for run, f in (together or {}).items()]
    for label, fit in rows:
        st, q = fit.fit.step_time, fit.quality()
        lines.append(
            f"| {label} | {q.samples} | {q.r_squared or math.nan:.3f} "
            f"| {pct(q.max_relative_error)} | {1e3 * st.base_s:.2f} "
            f"| {1e6 * st.per_prefill_token_s:.1f} | {1e6 * st.per_decode_seq_s:.1f} "
            f"| {1e9 * st.per_context_token_s:.1f} | {1e3 * st.decode_step_s(8, 1000):.2f} "
            f"| {1e3 * st.iteration_s(727, 0, 727):.1f} |"
        )
    return lines


def estimator_table(checks: Sequence[EstimatorCheck]) -> list[str]:
    lines = [
        "| run | requests predicted / all (annotated by a re-plan) | median abs. error, wait (s) "
        "| median abs. error, TTFT (s) | p95 bound held: wait / TTFT | recomputed vs annotated "
        "mean, max diff (s) |",
        "|" + "---|" * 6,
    ]
    for c in checks:
        lines.append(
            f"| {c.run} | {c.predicted} / {c.requests} ({c.annotated}) "
            f"| {_s(c.wait_abs_error_p50_s)} | {_s(c.ttft_abs_error_p50_s)} "
            f"| {pct(c.wait_bound_held)} / {pct(c.ttft_bound_held)} "
            f"| {_s(c.annotation_max_diff_s)} |"
        )
    return lines


def host_table(samples: Sequence[HostSample]) -> list[str]:
    lines = [
        "| phase | wall (s) | host CPU busy (all users) | this benchmark (cores) | load average "
        "1/5/15 min | CPU pressure (PSI some, 60 s) |",
        "|---|---|---|---|---|---|",
    ]
    for s in samples:
        la = "/".join(f"{x:.1f}" for x in s.load_average)
        lines.append(
            f"| {s.phase} | {s.wall_s:.0f} | {pct(s.host_cpu_busy)} "
            f"| {s.own_cpu_cores:.2f} | {la} "
            f"| {'n/a' if s.cpu_pressure is None else pct(s.cpu_pressure)} |"
        )
    return lines


def misses(comparisons: Sequence[Comparison]) -> list[str]:
    out = []
    for c in comparisons:
        for metric, target in (("ttft", TARGET_TTFT_P50), ("e2e", TARGET_E2E_P50)):
            err = c.error(metric, "p50")
            if not math.isnan(err) and err > target:
                out.append(
                    f"{c.run} ({c.profile} profile): "
                    f"{metric.upper() if metric == 'ttft' else 'end-to-end'} p50 error "
                    f"{pct(err)} > {pct(target)}"
                )
    return out


def one_line(c: Comparison) -> str:
    return (
        f"  {c.run} ({c.profile}): TTFT p50 live {_s(c.ttft_live['p50'])} sim "
        f"{_s(c.ttft_sim['p50'])} "
        f"({pct(c.error('ttft', 'p50'))}); e2e p50 live {_s(c.e2e_live['p50'])} sim "
        f"{_s(c.e2e_sim['p50'])} ({pct(c.error('e2e', 'p50'))}); attainment live "
        f"{pct(c.attainment_live['overall'])} sim {pct(c.attainment_sim['overall'])}"
    )


def swap_timeline(live_runs: Mapping[str, LiveRun]) -> list[str]:
    """Per run with swaps, each swap the live plane recorded: when it started and when the
    new model served (seconds from the run's start), so that a late first dispatch is told
    apart as a late decision or a long load."""
    lines: list[str] = []
    for name, live in live_runs.items():
        for at_s, kind, instance_id, detail in live.swap_events:
            what = "started" if kind == "swap" else "serving"
            lines.append(f"- {name}: {instance_id} {what} at {at_s:.1f} s: {detail}")
    return lines or ["- no swap in any run"]
