"""`qlm.control.prefill_backlog_s` is a setting of the decision both planes read: the simulated
agents bound the prefill they queue in an engine by it as the live agents do
(qlm/agents/agent.py passes it to reconcile; the replay scales it with the speedup,
tests/replay/test_parts.py)."""

from __future__ import annotations

from pathlib import Path

from qlm.agents.reconcile import ReconcileConfig
from qlm.config.agent_settings import AgentConfig
from qlm.replay.replay_cli import simulate_same
from qlm.sim.scenario import Scenario, load_scenario
from tests.factories import make_request

SIMS = Path(__file__).resolve().parents[2] / "sims"


def with_bound(scenario: Scenario, bound_s: float | None) -> Scenario:
    control = scenario.config.control.model_copy(update={"prefill_backlog_s": bound_s})
    config = scenario.qlm.model_copy(update={"control": control})
    return scenario.model_copy(update={"qlm": config})


def test_the_simulated_agents_queue_the_prefill_the_setting_allows() -> None:
    """A burst of long batch prompts (wc-quick's fleet): with no bound they all go to engines
    at once; with a tight one they wait in the global queue until the queued prefill drains."""
    scenario = load_scenario(SIMS / "wc-quick.yaml")
    burst = [
        make_request(
            id=f"long-{k}", model="mistral-7b", prompt_tokens=8000, max_output_tokens=20,
            slo_class="batch-1", arrival_at_s=0.01 * k, ttft_s=600.0,
        )
        for k in range(60)
    ]  # fmt: skip
    waits = {}
    for bound_s in (None, 0.05):
        result = simulate_same(with_bound(scenario, bound_s), burst, 1, "qlm")
        waits[bound_s] = sum(
            o.dispatch_s - o.arrival_s for o in result.outcomes if o.dispatch_s is not None
        )
    assert waits[0.05] > waits[None] + 1.0, waits


def test_the_live_agents_take_the_same_setting() -> None:
    options = ReconcileConfig.of(AgentConfig(), engine_backlog=0, prefill_backlog_s=0.25)
    assert options.prefill_backlog_s == 0.25
