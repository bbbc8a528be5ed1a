"""The prefill/decode split in the simulator (qlm/sim/handoff.py) and the `disagg` baseline
(qlm/sim/policies/disagg.py) on cases built to show each rule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from pydantic import ValidationError

from qlm.config import QlmConfig
from qlm.config.fleet_config import FleetConfig
from qlm.config.serve_config import ServeConfig
from qlm.engine.engine_types import EngineObservation, EngineState
from qlm.sim.handoff import roomiest_decode, transfer_s
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.simulate import simulate
from qlm.types import Fleet, Instance, InstanceRole, Request
from tests.factories import make_instance, make_profile

P, D, B = InstanceRole.PREFILL, InstanceRole.DECODE, InstanceRole.BOTH


def fleet(*roles: InstanceRole, gpus: Sequence[str] = (), link_bytes_per_s: float = 25e9) -> Fleet:
    """One m7b instance per role (A100 unless `gpus` says; H100s prefill 4x faster)."""
    types = list(gpus) or ["A100"] * len(roles)
    instances = [
        replace(make_instance(f"i{k}", gpu), role=role, kv_link_bytes_per_s=link_bytes_per_s)
        for k, (role, gpu) in enumerate(zip(roles, types, strict=True))
    ]
    profiles = [
        make_profile("m7b", "A100", prefill_tokens_per_s=10_000.0),
        make_profile("m7b", "H100", prefill_tokens_per_s=40_000.0),
    ]
    return Fleet.of(instances, profiles)


def req(id: str, at_s: float, prompt: int, output: int = 50) -> Request:
    return Request(id, "m7b", prompt, output, "batch-2", at_s, at_s + 3600.0)


def only(result: SimResult, request_id: str = "r") -> tuple[str | None, float, float]:
    o = next(o for o in result.outcomes if o.request_id == request_id)
    assert o.state is OutcomeState.COMPLETED
    assert o.first_token_s is not None
    assert o.finish_s is not None
    return o.instance_id, o.first_token_s, o.finish_s


def test_a_request_prefills_on_one_instance_and_decodes_on_the_other_after_its_kv_travels() -> None:
    request = req("r", 0.0, 4000)
    fast, slow = fleet(P, D), fleet(P, D, link_bytes_per_s=1e9)
    runs = [simulate(f, [request], "fcfs", QlmConfig(), 0) for f in (fast, slow)]
    (where, first, end), (slow_where, slow_first, slow_end) = (only(r) for r in runs)
    assert where == slow_where == "i1"  # fcfs prefilled it on i0: i1 decoded it
    assert first == slow_first
    kv_bytes = make_profile().kv_bytes_per_token * 4001  # the prompt and the first token
    assert slow_end - end == pytest.approx(kv_bytes / 1e9 - kv_bytes / 25e9, rel=1e-6)
    together = only(simulate(fleet(B), [request], "fcfs", QlmConfig(), 0))
    assert together[1] == first  # the same prefill, on the same GPU type
    assert end > together[2]  # and the transfer on top


def test_without_a_decode_instance_a_handed_off_request_fails_after_its_retries() -> None:
    result = simulate(fleet(P, P), [req("r", 0.0, 4000)], "fcfs", QlmConfig(), 0)
    (outcome,) = result.outcomes
    assert outcome.state is OutcomeState.FAILED
    reasons = {a.reason for a in result.interrupted}
    assert reasons == {"no decode instance of its model could take its KV"}


def test_roomiest_decode_takes_the_most_free_kv_and_queues_where_none_fits() -> None:
    def obs(instance_id: str, used: int, capacity: int = 10_000) -> EngineObservation:
        return EngineObservation(instance_id, EngineState.READY, "m7b", (), used, capacity, 8)

    request = req("r", 0.0, 1000)
    assert roomiest_decode(request, 1001, [obs("a", 5000), obs("b", 2000)]) == "b"
    assert roomiest_decode(request, 9000, [obs("a", 5000), obs("b", 2000)]) == "b"
    assert roomiest_decode(request, 1001, [obs("a", 5000), obs("b", 5000)]) == "a"
    assert roomiest_decode(request, 1001, []) is None


def test_transfer_time_is_the_kv_over_the_slower_link() -> None:
    a = Instance("a", "A100", 1, 80 << 30, "m7b", kv_link_bytes_per_s=50e9)
    b = replace(a, id="b", kv_link_bytes_per_s=10e9)
    assert transfer_s(1000, 131072, a, b) == pytest.approx(1000 * 131072 / 10e9)


def test_disagg_prefills_long_prompts_on_the_prefill_pool_and_short_ones_where_they_decode() -> (
    None
):
    """The H100 prefills 4x faster than the A100: a first token's time tells where a prompt
    was prefilled. A long prompt goes to the H100 (the prefill pool) and decodes on the A100;
    a short one is prefilled on the A100, where it decodes."""
    two = fleet(P, D, gpus=("H100", "A100"))
    long, short = req("long", 0.0, 8000), req("short", 30.0, 600)
    result = simulate(two, [long, short], "disagg", QlmConfig(), 0)
    (long_at, long_first, _), (short_at, short_first, _) = (
        only(result, "long"),
        only(result, "short"),
    )
    assert long_at == short_at == "i1"
    alone = {
        gpu: only(simulate(fleet(B, gpus=(gpu,)), [r], "fcfs", QlmConfig(), 0), r.id)[1]
        - r.arrival_at_s
        for gpu, r in (("H100", long), ("A100", short))
    }
    assert long_first == pytest.approx(alone["H100"])
    assert short_first - 30.0 == pytest.approx(alone["A100"])
    # with the threshold above the long prompt, it too stays on the decode side
    local = simulate(
        two, [long], "disagg", QlmConfig(), 0, policy_options={"max_local_prefill_tokens": 10_000}
    )
    first = only(local, "long")[1]
    a100 = only(simulate(fleet(B), [long], "fcfs", QlmConfig(), 0), "long")[1]
    assert first == pytest.approx(a100)


def test_disagg_is_llmd_on_a_fleet_without_roles() -> None:
    requests = [req(f"r{k}", k * 0.3, 500 + 300 * k) for k in range(8)]
    plain = fleet(B, B)
    a = simulate(plain, requests, "disagg", QlmConfig(), 0)
    b = simulate(plain, requests, "llmd", QlmConfig(), 0)
    assert [o.instance_id for o in a.outcomes] == [o.instance_id for o in b.outcomes]
    assert [o.finish_s for o in a.outcomes] == [o.finish_s for o in b.outcomes]


def test_a_fleet_file_sets_roles_and_links_and_the_live_plane_refuses_a_split() -> None:
    groups = [
        {"gpu_type": "H100", "model": "mistral-7b", "role": "prefill", "kv_link_gb_per_s": 50},
        {"gpu_type": "A100", "count": 2, "model": "mistral-7b", "role": "decode"},
    ]
    built = FleetConfig.model_validate({"instances": groups}).fleet(["mistral-7b"])
    assert [(i.role, i.kv_link_bytes_per_s) for i in built.instances] == [
        (P, 50e9),
        (D, 25e9),
        (D, 25e9),
    ]
    with pytest.raises(ValidationError, match=r"fleet\.instances\.0\.role"):
        ServeConfig.model_validate(
            {"models": [{"name": "mistral-7b"}], "fleet": {"instances": groups[:1]}}
        )
    with pytest.raises(ValidationError, match="role"):
        FleetConfig.model_validate({"instances": [{**groups[0], "role": "sideways"}]})
