"""The qlm dispatcher's swap test (`SimDispatch.swap_pays`) against thrashing: instances that
are loading a model count in its pool (three idle instances do not all swap for one model's
requests), and taking a model's last instance away counts the arrivals expected meanwhile
that cannot wait for it to come back (`ArrivalRates.at_risk`)."""

from __future__ import annotations

from collections import Counter

import pytest

from qlm.agents.arrival_rates import ArrivalRates, Side
from qlm.agents.decision import outweighs
from qlm.config import QlmConfig, SloClassConfig
from qlm.sim.simulate import simulate
from tests.factories import make_request
from tests.sim.cases import two_model_fleet


def test_at_risk_counts_recent_arrivals_whose_budget_is_shorter_than_the_absence() -> None:
    rates = ArrivalRates(window_s=10.0)
    for k in range(10):
        rates.arrived("m", float(k), budget_s=2.0 if k % 2 else 60.0)
    # 5 urgent arrivals in the 10 s window: 0.5 / s; an absence of 4 s puts 2 at risk
    assert rates.at_risk("m", 10.0, 4.0) == 2.0
    assert rates.at_risk("m", 10.0, 100.0) == 10 / 10 * 100.0  # all are urgent then
    # watched for 9 s only (since the first arrival at 0): the rate is over those 9 s
    assert rates.at_risk("m", 9.0, 4.0) == 5 / 9 * 4.0
    assert rates.at_risk("m", 30.0, 4.0) == 0.0  # the window moved past them
    assert rates.at_risk("other", 9.0, 4.0) == 0.0


def test_idle_instances_do_not_all_swap_for_the_same_requests() -> None:
    fleet = two_model_fleet(num_7b=3, num_13b=0, load_s=5.0)
    requests = [
        make_request(model="m13b", slo_class="batch-1", arrival_at_s=0.1 * k, ttft_s=120.0)
        for k in range(3)
    ]
    result = simulate(fleet, requests, "qlm", QlmConfig(), 0)
    assert result.attainment() == 1.0
    assert Counter(load.model for load in result.loads)["m13b"] == 1


def test_the_last_instance_of_a_busy_model_stays_for_its_urgent_arrivals() -> None:
    """One instance serves m7b, whose interactive requests (3 s budget) come every 0.5 s; a
    batch request for m13b (no instance; 5 s to load either way) waits rather than take
    m7b's only instance away, which would leave the m7b requests of the next 10 s late."""
    fleet = two_model_fleet(num_7b=1, num_13b=0, load_s=5.0)
    chats = [
        make_request(model="m7b", arrival_at_s=0.5 * k, ttft_s=3.0, max_output_tokens=16)
        for k in range(60)
    ]
    batch = make_request(model="m13b", slo_class="batch-1", arrival_at_s=10.0, ttft_s=600.0)
    classes = (
        SloClassConfig(name="interactive", ttft_s=3.0, lateness_weight=100, priority=2),
        SloClassConfig(name="batch-1", ttft_s=600.0, lateness_weight=1, priority=0),
    )
    result = simulate(fleet, [*chats, batch], "qlm", QlmConfig(slo_classes=classes), 0)
    assert result.attainment("interactive") == 1.0
    assert result.attainment("batch-1") == 1.0  # served once the chats stop


def test_a_models_last_instance_stays_until_its_arrivals_were_watched_for_the_absence() -> None:
    """At the start nothing has arrived for m7b yet, which says nothing of its rate: m7b's
    only instance is not swapped to m13b (5 s to load, 5 s back) before arrivals have been
    watched for those 10 s; m7b's interactive requests in the meantime are all served."""
    fleet = two_model_fleet(num_7b=1, num_13b=0, load_s=5.0)
    batch = make_request(model="m13b", slo_class="batch-1", arrival_at_s=0.0, ttft_s=120.0)
    chats = [
        make_request(model="m7b", arrival_at_s=2.0 + k, ttft_s=3.0, max_output_tokens=16)
        for k in range(5)
    ]
    classes = (
        SloClassConfig(name="interactive", ttft_s=3.0, lateness_weight=100, priority=2),
        SloClassConfig(name="batch-1", ttft_s=120.0, lateness_weight=1, priority=0),
    )
    result = simulate(fleet, [batch, *chats], "qlm", QlmConfig(slo_classes=classes), 0)
    assert result.attainment("interactive") == 1.0
    assert min(load.start_s for load in result.loads) >= 10.0
    assert result.attainment("batch-1") == 1.0


def test_watched_for_counts_from_the_first_arrival_of_any_model() -> None:
    rates = ArrivalRates(window_s=60.0)
    assert not rates.watched_for(5.0, 1.0)  # nothing seen yet
    rates.arrived("a", 3.0, 20.0)
    assert rates.watched_for(13.0, 10.0)
    assert not rates.watched_for(12.9, 10.0)


def test_rates_are_taken_over_the_time_watched_while_shorter_than_the_window() -> None:
    """Five arrivals in the first 5 s are a rate of 1 / s, not 5 / 60 (which let a plane
    just started give away a model's only instance in the lull before its traffic)."""
    rates = ArrivalRates(window_s=60.0)
    for k in range(5):
        rates.arrived("m", float(k), budget_s=10.0)
    assert rates.expected("m", 5.0, 10.0) == 10.0
    assert rates.at_risk("m", 5.0, 20.0) == 20.0  # every budget is shorter than the absence
    assert rates.expected("m", 60.0, 10.0) == 5 / 60 * 10.0  # the window is full by then
    assert rates.expected("other", 5.0, 10.0) == 0.0


def test_a_forecast_longer_than_the_window_looks_back_to_ten_arrivals() -> None:
    """One arrival every 10 s for 250 s, then a 60 s lull: the window reads no arrival, but
    over a 120 s absence the rate is taken back to the tenth newest arrival (151 s ago: 10 in
    151 s); over 30 s the window alone is read. A window holding ten or more is read alone,
    and a model with fewer than ten in all the memory gets the memory's rate."""
    rates = ArrivalRates(window_s=60.0, memory_s=300.0)
    for k in range(26):
        rates.arrived("m", 10.0 * k, budget_s=10.0)
    for at_s in (100.0, 150.0, 250.0):
        rates.arrived("sparse", at_s, budget_s=10.0)
    assert not rates.stopped("m", 311.0)  # about 6 a window: a lull, not a stop
    assert rates.at_risk("m", 311.0, 30.0) == 0.0
    assert rates.at_risk("m", 311.0, 120.0) == pytest.approx(10 / 151 * 120)
    assert rates.at_risk("m", 311.0, 5.0) == 0.0  # the budgets (10 s) are not shorter
    for k in range(12):
        rates.arrived("m", 320.0 + k, budget_s=10.0)
    assert rates.expected("m", 332.0, 120.0) == pytest.approx(12 / 60 * 120)  # the window's
    assert rates.expected("sparse", 320.0, 120.0) == pytest.approx(3 / 300 * 120)


def test_a_model_whose_arrivals_stopped_reads_no_rate() -> None:
    """One arrival every 2 s for 200 s, then none for a window: its memory expects 30 in a
    window, none came, so it stopped, and every read of its rate is 0 (read back to its tenth
    newest arrival, it held its last instance for minutes after its traffic ended)."""
    rates = ArrivalRates(window_s=60.0, memory_s=300.0)
    for k in range(100):
        rates.arrived("m", 2.0 * k, budget_s=10.0)
    assert not rates.stopped("m", 250.0)  # an arrival 52 s ago: within the window
    assert rates.stopped("m", 260.0)
    for side in Side:
        assert rates.at_risk("m", 260.0, 120.0, side) == 0.0
        assert rates.expected("m", 260.0, 30.0, side) == 0.0


def test_the_gates_reads_with_hysteresis_take_the_higher_or_lower_of_two_rates() -> None:
    """A model that arrived once a second for 60 s and then three times in 60 s: its recent
    rate (the last 60 s) is 0.05 / s, its longer-run rate (two windows) 63 / 120 s. What a
    swap loses reads the higher, what it gains the lower; the point read is the recent rate."""
    rates = ArrivalRates(window_s=60.0)
    for k in range(60):
        rates.arrived("m", float(k), budget_s=10.0)
    for at_s in (70.0, 90.0, 110.0):
        rates.arrived("m", at_s, budget_s=10.0)
    assert rates.expected("m", 120.0, 20.0) == pytest.approx(3 / 60 * 20.0)
    assert rates.expected("m", 120.0, 20.0, Side.HIGH) == pytest.approx(63 / 120 * 20.0)
    assert rates.expected("m", 120.0, 20.0, Side.LOW) == pytest.approx(3 / 60 * 20.0)
    assert rates.at_risk("m", 120.0, 20.0, Side.HIGH) == pytest.approx(63 / 120 * 20.0)
    # in a burst the other way round: 60 in the last 60 s, none before
    burst = ArrivalRates(window_s=60.0)
    burst.arrived("n", 0.0, budget_s=10.0)  # watching since 0
    for k in range(60):
        burst.arrived("n", 60.0 + k, budget_s=10.0)
    assert burst.expected("n", 120.0, 10.0, Side.LOW) == pytest.approx(61 / 120 * 10.0)
    assert burst.expected("n", 120.0, 10.0, Side.HIGH) == pytest.approx(60 / 60 * 10.0)


def test_a_swap_must_outweigh_what_it_breaks_by_more_than_the_noise() -> None:
    assert not outweighs(1.0, 0.0)  # one request's worth is within the noise
    assert outweighs(2.0, 0.0)
    assert not outweighs(25.0, 20.0)  # 5 < sqrt(45)
    assert outweighs(30.0, 20.0)  # 10 > sqrt(50)
    assert not outweighs(-3.0, 0.0)


def test_a_model_with_no_instance_wins_one_when_its_traffic_outweighs_the_loaded_ones() -> None:
    """One instance holds m7b, which gets a chat every 4 s (3 s budget) for 200 s; m13b has
    no instance and gets a batch request every 0.5 s (120 s budget). Taking the instance
    breaks about five m7b promises (its arrivals over the load, a stay as long as the round
    trip, the way back: 20 s at 0.25 / s) and keeps every m13b request; waiting for m7b's
    traffic to stop, as the gate did when it let an instance go to a model no instance
    serves only if that broke no promise at all, misses them all."""
    fleet = two_model_fleet(num_7b=1, num_13b=0, load_s=5.0)
    chats = [
        make_request(model="m7b", arrival_at_s=4.0 * k, ttft_s=3.0, max_output_tokens=16)
        for k in range(50)
    ]
    batch = [
        make_request(
            model="m13b", slo_class="batch-1", arrival_at_s=20.0 + 0.5 * k, ttft_s=120.0,
            max_output_tokens=16,
        )
        for k in range(300)
    ]  # fmt: skip
    classes = (
        SloClassConfig(name="interactive", ttft_s=3.0, lateness_weight=100, priority=2),
        SloClassConfig(name="batch-1", ttft_s=120.0, lateness_weight=1, priority=0),
    )
    result = simulate(fleet, [*chats, *batch], "qlm", QlmConfig(slo_classes=classes), 0)
    assert result.attainment("batch-1") >= 0.9
    assert result.attainment() >= 0.85
    assert min(load.start_s for load in result.loads if load.model == "m13b") < 60.0


def test_a_busy_models_lull_and_a_tail_models_burst_do_not_line_up_into_a_swap() -> None:
    """m7b (one instance; 5 s to load either way) gets a chat every second (3 s budget) but
    for a 40 s lull; m13b (no instance) bursts at 6 chats a second for the lull's last 10 s
    and then stops. Read over the last minute alone, m13b's rate outweighs m7b's near the
    lull's end, and the gate took m7b's only instance for a model whose burst its load cannot
    save (3 s budgets) and whose traffic had ended; read with hysteresis (m7b's loss at the
    higher of its recent and longer-run rate, m13b's gain at the lower), m7b keeps it."""
    fleet = two_model_fleet(num_7b=1, num_13b=0, load_s=5.0)
    chat_at_s = [float(t) for t in range(250) if not 90 <= t < 130]
    chats = [
        make_request(model="m7b", arrival_at_s=at_s, ttft_s=3.0, max_output_tokens=16)
        for at_s in chat_at_s
    ]
    burst = [
        make_request(model="m13b", arrival_at_s=120.0 + k / 6, ttft_s=3.0, max_output_tokens=16)
        for k in range(60)
    ]
    classes = (SloClassConfig(name="interactive", ttft_s=3.0, lateness_weight=100, priority=2),)
    result = simulate(fleet, [*chats, *burst], "qlm", QlmConfig(slo_classes=classes), 0)
    kept_7b = sum(o.met_slo for o in result.outcomes if o.model == "m7b")
    assert kept_7b == len(chats)
    assert not [load for load in result.loads if load.start_s < 250.0]
