"""The shared vocabulary: request lifecycle, request and SLO validation, fleets."""

from __future__ import annotations

import itertools

import pytest

from qlm.perf.profile import GIB
from qlm.types import (
    DEFAULT_GPU_TYPES,
    DEFAULT_SLO_CLASSES,
    Fleet,
    IllegalTransitionError,
    Instance,
    Request,
    RequestState,
    SloClass,
)
from tests.factories import make_instance, make_profile, make_request

S = RequestState

# The lifecycle written out independently of qlm.types.TRANSITIONS, so a change to the table
# has to be made on purpose in both places.
LEGAL: dict[RequestState, set[RequestState]] = {
    # planned and pulled by an engine, or given up before it ran
    S.QUEUED: {S.DISPATCHED, S.CANCELLED, S.FAILED},
    # starts producing tokens, or is evicted back to the queue before it did
    S.DISPATCHED: {S.RUNNING, S.QUEUED, S.CANCELLED, S.FAILED},
    # finishes, or is evicted (RUNNING -> QUEUED) to make room for more urgent work
    S.RUNNING: {S.COMPLETED, S.QUEUED, S.CANCELLED, S.FAILED},
    # terminal states have no exits
    S.COMPLETED: set(),
    S.CANCELLED: set(),
    S.FAILED: set(),
}

ALL_PAIRS = list(itertools.product(RequestState, RequestState))
LEGAL_PAIRS = [(a, b) for a, b in ALL_PAIRS if b in LEGAL[a]]
ILLEGAL_PAIRS = [(a, b) for a, b in ALL_PAIRS if b not in LEGAL[a]]


def _in_state(state: RequestState) -> Request:
    return Request(
        id="req-1",
        model="m7b",
        prompt_tokens=10,
        max_output_tokens=10,
        slo_class="interactive",
        arrival_at_s=0.0,
        ttft_deadline_at_s=20.0,
        state=state,
    )


# --- lifecycle ----------------------------------------------------------------------------


def test_table_covers_all_pairs() -> None:
    # 6 states -> 36 ordered pairs; 11 legal moves (3 + 4 + 4 + 0 + 0 + 0) and 25 illegal.
    assert len(LEGAL_PAIRS) == 11
    assert len(ILLEGAL_PAIRS) == 25


@pytest.mark.parametrize(("src", "dst"), LEGAL_PAIRS, ids=lambda s: str(s))
def test_legal_transition_moves_to_new_state(src: RequestState, dst: RequestState) -> None:
    before = _in_state(src)
    after = before.transition(dst)
    # The new value carries the new state; the old value is untouched (frozen types).
    assert after.state is dst
    assert before.state is src
    assert after.id == before.id


@pytest.mark.parametrize(("src", "dst"), ILLEGAL_PAIRS, ids=lambda s: str(s))
def test_illegal_transition_rejected_naming_both_states(
    src: RequestState, dst: RequestState
) -> None:
    with pytest.raises(IllegalTransitionError) as info:
        _in_state(src).transition(dst)
    message = str(info.value)
    # The message names the request and the exact move that was refused.
    assert "req-1" in message
    assert f"{src.value} -> {dst.value}" in message
    # IllegalTransitionError is a ValueError, so generic callers can catch it.
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("state", "terminal"),
    [
        (S.QUEUED, False),  # waiting: can still be dispatched
        (S.DISPATCHED, False),  # in an engine, not yet running
        (S.RUNNING, False),  # producing tokens
        (S.COMPLETED, True),  # done
        (S.CANCELLED, True),  # given up by the client
        (S.FAILED, True),  # given up by the system
    ],
)
def test_is_terminal(state: RequestState, terminal: bool) -> None:
    assert state.is_terminal is terminal


@pytest.mark.parametrize("state", [S.COMPLETED, S.CANCELLED, S.FAILED])
def test_terminal_error_says_no_exit(state: RequestState) -> None:
    # With no allowed moves the message says so instead of listing an empty set.
    with pytest.raises(IllegalTransitionError, match=r"none \(terminal\)"):
        _in_state(state).transition(S.QUEUED)


def test_eviction_round_trip() -> None:
    # RUNNING -> QUEUED is the eviction path; the request can then run again to completion.
    r = _in_state(S.QUEUED)
    for step in (S.DISPATCHED, S.RUNNING, S.QUEUED, S.DISPATCHED, S.RUNNING, S.COMPLETED):
        r = r.transition(step)
    assert r.state is S.COMPLETED


# --- request validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"prompt_tokens": 0}, "prompt_tokens must be >= 1"),  # an empty prompt is no request
        ({"prompt_tokens": -5}, "prompt_tokens must be >= 1"),
        ({"max_output_tokens": 0}, "max_output_tokens must be >= 1"),  # must make a token
        ({"ttft_deadline_at_s": 9.9}, "ttft deadline before arrival"),  # arrival is 10.0
        (
            {"ttft_deadline_at_s": 30.0, "completion_deadline_at_s": 29.0},
            "completion deadline before ttft deadline",  # cannot finish before the first token
        ),
    ],
)
def test_request_validation(overrides: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {
        "id": "bad",
        "model": "m7b",
        "prompt_tokens": 10,
        "max_output_tokens": 10,
        "slo_class": "interactive",
        "arrival_at_s": 10.0,
        "ttft_deadline_at_s": 30.0,
    }
    fields.update(overrides)
    with pytest.raises(ValueError, match=match):
        Request(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides"),
    [
        {"ttft_deadline_at_s": 10.0},  # deadline equal to arrival is allowed (zero slack)
        {"prompt_tokens": 1, "max_output_tokens": 1},  # the smallest legal request
        {"completion_deadline_at_s": 30.0},  # completion equal to the ttft deadline
    ],
)
def test_request_boundaries_accepted(overrides: dict[str, object]) -> None:
    fields: dict[str, object] = {
        "id": "ok",
        "model": "m7b",
        "prompt_tokens": 10,
        "max_output_tokens": 10,
        "slo_class": "interactive",
        "arrival_at_s": 10.0,
        "ttft_deadline_at_s": 30.0,
    }
    fields.update(overrides)
    assert Request(**fields).state is S.QUEUED  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("slo", "arrival", "ttft_deadline", "completion_deadline"),
    [
        # deadline = arrival + ttft_s; no completion target -> no completion deadline
        (SloClass("interactive", ttft_s=20.0), 100.0, 120.0, None),
        # completion deadline = arrival + completion_s
        (SloClass("batch-1", ttft_s=60.0, completion_s=300.0), 5.0, 65.0, 305.0),
        # arrival at 0 makes deadlines equal to the targets
        (SloClass("batch-2", ttft_s=3600.0), 0.0, 3600.0, None),
    ],
)
def test_request_create_derives_deadlines(
    slo: SloClass, arrival: float, ttft_deadline: float, completion_deadline: float | None
) -> None:
    r = Request.create("r", "m7b", 100, 50, slo, arrival_at_s=arrival)
    assert r.slo_class == slo.name
    assert r.ttft_deadline_at_s == ttft_deadline
    assert r.completion_deadline_at_s == completion_deadline
    assert r.ttft_slo_s == slo.ttft_s  # the relative target comes back out of the deadline
    assert r.state is S.QUEUED  # a new request starts queued


# --- SLO classes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "", "ttft_s": 1.0}, "name must not be empty"),
        ({"name": "x", "ttft_s": 0.0}, "positive finite"),  # zero target is unmeetable
        ({"name": "x", "ttft_s": -1.0}, "positive finite"),
        ({"name": "x", "ttft_s": float("inf")}, "positive finite"),  # inf is not a target
        ({"name": "x", "ttft_s": float("nan")}, "positive finite"),  # nan fails 0 < nan
        ({"name": "x", "ttft_s": 10.0, "completion_s": 5.0}, "completion_s must be >= ttft_s"),
        ({"name": "x", "ttft_s": 1.0, "lateness_weight": -0.1}, "lateness_weight must be >= 0"),
    ],
)
def test_slo_class_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SloClass(**kwargs)  # type: ignore[arg-type]


def test_default_slo_classes_are_the_papers() -> None:
    # QLM paper: interactive 20 s TTFT, batch-1 60 s, batch-2 1 hour.
    targets = {c.name: c.ttft_s for c in DEFAULT_SLO_CLASSES}
    assert targets == {"interactive": 20.0, "batch-1": 60.0, "batch-2": 3600.0}
    # Tighter targets are more urgent: priority and lateness weight fall as the target grows.
    by_target = sorted(DEFAULT_SLO_CLASSES, key=lambda c: c.ttft_s)
    assert [c.priority for c in by_target] == sorted((c.priority for c in by_target), reverse=True)
    assert [c.lateness_weight for c in by_target] == sorted(
        (c.lateness_weight for c in by_target), reverse=True
    )


# --- fleets -------------------------------------------------------------------------------

A10_BYTES = DEFAULT_GPU_TYPES["A10"].memory_bytes
A100_BYTES = DEFAULT_GPU_TYPES["A100"].memory_bytes


def test_default_gpu_memory() -> None:
    assert A10_BYTES == 24 * GIB  # NVIDIA A10: 24 GiB
    assert A100_BYTES == 80 * GIB  # A100 80GB variant


def _fleet_13b() -> tuple[Fleet, Instance, Instance]:
    a10 = Instance("a10-0", "A10", 1, A10_BYTES)
    a100 = Instance("a100-0", "A100", 1, A100_BYTES)
    # 13B fp16: 26 GiB of weights; KV ~800 KiB per token (40 layers x 5120 x 2 x 2 bytes).
    profiles = [
        make_profile("m13b", "A10", weight_gib=26.0, kv_kib_per_token=800.0),
        make_profile("m13b", "A100", weight_gib=26.0, kv_kib_per_token=800.0),
    ]
    return Fleet.of([a10, a100], profiles), a10, a100


@pytest.mark.parametrize(
    ("instance_id", "model", "servable"),
    [
        # 0.9 x 24 GiB = 21.6 GiB usable < 26 GiB of weights: no room at all.
        ("a10-0", "m13b", False),
        # 0.9 x 80 - 26 = 46 GiB / 800 KiB = 60293 KV tokens >= 4096 minimum.
        ("a100-0", "m13b", True),
        # No profile for this model anywhere.
        ("a100-0", "unknown", False),
    ],
)
def test_can_serve_by_memory(instance_id: str, model: str, servable: bool) -> None:
    fleet, _, _ = _fleet_13b()
    assert fleet.can_serve(fleet.instance(instance_id), model) is servable


@pytest.mark.parametrize(
    ("instance_gpus", "servable"),
    [
        (1, False),  # a tensor-parallel-2 profile needs two GPUs
        (2, True),  # exactly enough
        (4, True),  # more GPUs than needed is fine
    ],
)
def test_can_serve_needs_profile_gpu_count(instance_gpus: int, servable: bool) -> None:
    inst = make_instance("big", gpu_count=instance_gpus)
    fleet = Fleet.of([inst], [make_profile("m70b", gpu_count=2, weight_gib=130.0)])
    assert fleet.can_serve(inst, "m70b") is servable


def test_can_serve_needs_profile_for_gpu_type() -> None:
    # The model has an A100 profile only; an H100 instance has no numbers, so it cannot serve.
    h100 = make_instance("h", gpu_type="H100")
    fleet = Fleet.of([h100], [make_profile("m7b", "A100")])
    assert fleet.can_serve(h100, "m7b") is False


def test_fleet_rejects_duplicate_instance_ids() -> None:
    with pytest.raises(ValueError, match="unique"):
        Fleet.of([make_instance("i0"), make_instance("i0")], [])


def test_fleet_lookup_and_models() -> None:
    fleet, a10, _ = _fleet_13b()
    assert fleet.instance("a10-0") == a10
    assert fleet.models == ("m13b",)  # one model, profiled on two GPU types
    with pytest.raises(KeyError, match="nope"):
        fleet.instance("nope")


def test_fleet_profiles_are_read_only() -> None:
    fleet, _, _ = _fleet_13b()
    with pytest.raises(TypeError):
        fleet.profiles[("x", "y")] = make_profile()  # type: ignore[index]


@pytest.mark.parametrize(
    ("gpu_count", "memory", "match"),
    [
        (0, GIB, "gpu_count must be >= 1"),
        (1, 0, "gpu_memory_bytes must be > 0"),
    ],
)
def test_instance_validation(gpu_count: int, memory: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Instance("i", "A100", gpu_count, memory)


def test_make_request_factory_deadlines() -> None:
    # Sanity of the shared factory other tests rely on: deadline = arrival + ttft_s.
    r = make_request(arrival_at_s=3.0, ttft_s=7.0, completion_s=20.0)
    assert (r.ttft_deadline_at_s, r.completion_deadline_at_s) == (10.0, 23.0)
