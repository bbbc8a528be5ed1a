"""`qlm profile` against a real vLLM-CPU engine serving the tiny model (the quick grid): the
profile file it writes loads, carries the measurement, and the simulator serves with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qlm.cli import main
from qlm.config.profile_files import load_profile_file
from qlm.engine.profiling.probes import Probe, ProbeKind, ProfileGrid
from qlm.perf.profile import GIB
from qlm.sim.scenario import load_scenario
from tests.vllm_fixtures import VLLM_PYTHON, tiny_models, vllm_python  # noqa: F401

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


def kinds(probe: Probe) -> list[str]:
    """The samples one probe yields."""
    if probe.kind is ProbeKind.PREFILL:
        return ["prefill"]
    return ["mixed" if probe.batch_size > 1 else "prefill", "decode"]


def test_qlm_profile_measures_the_tiny_model_and_the_simulator_reads_the_file(
    tiny_models: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "tiny-a_cpu.yaml"
    argv = [
        "profile",
        "--engine",
        "vllm",
        "--model",
        str(tiny_models["tiny-a"]),
        "--name",
        "tiny-a",
        "--out",
        str(out),
        "--quick",
        "--python",
        str(VLLM_PYTHON),
        "--dtype",
        "bfloat16",
        # the server on a core of its own: timings the profiling client does not disturb
        # (on shared cores the fit once came out at R^2 0.48)
        "--cpu-cores",
        str(max(os.sched_getaffinity(0))),
        "--standby",
        "--quiet",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "R^2" in printed
    assert "max relative error" in printed
    assert f"wrote {out}" in printed
    assert "wake from standby" in printed

    spec = load_profile_file(out)
    m = spec.measurement
    assert m is not None
    assert m.engine.startswith("vllm ")
    assert m.grid == ProfileGrid.quick().summary()
    # 3 prefill probes + 2 contexts x (a batch of 1: prefill + decode; of 4: mixed + decode);
    # a probe that never got a clean window on a busy host is skipped and listed as such
    probes = {p.label: p for p in ProfileGrid.quick().probes()}
    assert len(probes) == 7
    assert set(m.skipped_probes) <= set(probes)
    assert len(m.skipped_probes) <= 1, m.skipped_probes
    measured = [p for label, p in probes.items() if label not in m.skipped_probes]
    assert sorted(r.kind for r in m.iterations) == sorted(k for p in measured for k in kinds(p))
    assert all(r.measured_s > 0 for r in m.iterations)
    assert m.fit.samples == len(m.iterations)
    assert m.fit.r_squared is not None
    assert m.fit.r_squared > 0.5  # loose: the host is shared and noisy
    # the standby tier: a switch back to a parked server beats a cold start at least 5x
    assert len(m.wake_s_samples) == 1
    assert spec.wake_s is not None
    assert spec.load_s >= 5 * spec.wake_s, (spec.load_s, spec.wake_s)
    assert spec.provenance.fields["wake_s"].kind == "measured"
    assert m.request_overhead_s is not None
    assert m.request_overhead_s > 0
    prefills = {r.prefill_tokens: r.measured_s for r in m.iterations if r.kind == "prefill"}
    # a long prompt costs more than a short one (1,536 vs 16 tokens unless one was skipped)
    assert max(prefills) >= 1024
    assert min(prefills) <= 256
    assert prefills[max(prefills)] > prefills[min(prefills)]

    profile = spec.to_profile()
    assert profile.key == ("tiny-a", "cpu")
    assert profile.load_s > 1.0
    assert profile.max_batch_size == 8
    # tiny-a: 2 layers x 2 heads x 64 dims x (K and V) x 2 bytes; 64 MiB of cache
    assert profile.kv_bytes_per_token == 1024
    assert profile.kv_capacity_tokens(GIB) == (64 * 2**20 // 1024) - 128
    assert {f.kind for k, f in spec.provenance.fields.items() if k.startswith("step_time")} == {
        "measured"
    }

    scenario_path = tmp_path / "scenario.yaml"
    scenario_path.write_text(
        "name: measured\n"
        "fleet:\n"
        "  gpu_types: {cpu: {memory_gib: 1}}\n"
        f"  profile_files: [{out.name}]\n"
        "  instances: [{gpu_type: cpu, count: 1, model: tiny-a}]\n"
        "workload:\n"
        "  - {name: w, arrivals: {process: poisson, rate_per_s: 1}, count: 5, "
        "models: {tiny-a: 1}, classes: {interactive: 1}, "
        "lengths: {source: fixed, prompt_tokens: 100, output_tokens: 20}}\n"
    )
    scenario = load_scenario(scenario_path)
    (instance,) = scenario.fleet().instances
    assert scenario.fleet().profile("tiny-a", instance) == profile
