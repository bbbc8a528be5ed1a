"""Engines that share GPUs (an instance group's `slices`): the fleet splits the memory, the
engines take turns on the compute (qlm/sim/sharing.py), the live plane refuses it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from qlm.clock import VirtualClock
from qlm.config.fleet_config import FleetConfig
from qlm.config.serve_config import ServeConfig
from qlm.engine.engine_types import RequestFinished
from qlm.engine.model.shared import SharedEngineModel
from qlm.engine.simulated import SimulatedEngine
from qlm.perf.profile import GIB
from qlm.sim.result import SimResult
from qlm.sim.sharing import SharedGpus
from qlm.sim.simulate import simulate
from qlm.sim.tracking import Slot
from qlm.types import Fleet, Instance, Request
from tests.engine.helpers import exact_instance, exact_profile, req, run_all
from tests.factories import make_instance, make_profile, make_request
from tests.sim.cases import CONFIG


def test_a_group_s_slices_split_each_gpu_s_memory_between_engines() -> None:
    config = FleetConfig.model_validate(
        {"instances": [{"gpu_type": "H100", "count": 2, "model": "mistral-7b", "slices": 2}]}
    )
    built = config.fleet(["mistral-7b"])
    ids = [i.id for i in built.instances]
    assert ids == [f"h100-mistral-7b-{k}-s{j}" for k in range(2) for j in range(2)]
    first, second = built.instances[:2]
    assert first.gpu_memory_bytes == second.gpu_memory_bytes == 40 * GIB
    assert first.device == second.device == "h100-mistral-7b-0"
    assert (first.loaded_model, second.loaded_model) == ("mistral-7b", None)
    assert first.gpus == 0.5
    assert config.counts() == {"H100": 2}  # GPUs are counted once, not per engine
    assert config.with_counts({"H100": 3}).fleet(["mistral-7b"]).instances[-1].id.endswith("-2-s1")


def test_a_group_s_model_starts_in_the_smallest_slice_it_fits() -> None:
    def started(model: str) -> list[str | None]:
        group = {"gpu_type": "H100", "model": model, "slices": 3}
        group["slice_memory"] = [0.5, 0.25, 0.25]
        fleet = FleetConfig.model_validate({"instances": [group]}).fleet([model])
        return [i.loaded_model for i in fleet.instances]

    # A 7B fits a quarter: the half stays free for a 13B, which fits only the half.
    assert started("mistral-7b") == [None, "mistral-7b", None]
    assert started("vicuna-13b") == ["vicuna-13b", None, None]


def test_a_model_that_does_not_fit_its_slice_is_refused_naming_the_slices() -> None:
    with pytest.raises(ValidationError, match=r"any of its slices' memory"):
        FleetConfig.model_validate(
            {"instances": [{"gpu_type": "H100", "model": "vicuna-13b", "slices": 3}]}
        )


def test_the_live_plane_refuses_shared_gpus_naming_the_field() -> None:
    document: dict[str, Any] = {
        "models": [{"name": "mistral-7b"}],
        "fleet": {"instances": [{"gpu_type": "H100", "model": "mistral-7b", "slices": 2}]},
    }
    with pytest.raises(ValidationError, match=r"fleet\.instances\.0\.slices"):
        ServeConfig.model_validate(document)


def test_an_instance_names_its_device_exactly_when_it_is_shared() -> None:
    with pytest.raises(ValueError, match="device"):
        Instance("a", "H100", 1, GIB, slices=2)
    with pytest.raises(ValueError, match="device"):
        Instance("a", "H100", 1, GIB, device="gpu0")


def test_taking_turns_stretches_the_iterations_planned_from_then_on() -> None:
    alone, shared, late = (
        SharedEngineModel(exact_instance(100_000), [exact_profile()]) for _ in range(3)
    )
    for model in (alone, shared, late):
        model.add(req("r", prompt=100, output=200), 0.0)
    shared.take_turns(2, 0.0)
    (end_alone,) = [e.at_s for e in run_all(alone) if isinstance(e, RequestFinished)]
    (end_shared,) = [e.at_s for e in run_all(shared) if isinstance(e, RequestFinished)]
    assert end_shared == pytest.approx(2 * end_alone)
    late.advance_to(end_alone / 2)
    late.take_turns(2, end_alone / 2)  # the first half ran alone
    (end_late,) = [e.at_s for e in run_all(late) if isinstance(e, RequestFinished)]
    assert end_late == pytest.approx(1.5 * end_alone, rel=0.02)


def _fleet(shared: bool) -> Fleet:
    """Two engines of 40 GiB each, one per model: on one shared GPU, or on a GPU each."""
    profiles = [make_profile("m7b"), make_profile("m13b", weight_gib=26.0)]
    instances = []
    for k, model in enumerate(("m7b", "m13b")):
        base = make_instance(f"e{k}", memory_gib=40.0, loaded_model=model)
        instances.append(replace(base, slices=2, device="gpu0") if shared else base)
    return Fleet.of(instances, profiles)


def _ends(fleet: Fleet, requests: list[Request]) -> dict[str, float]:
    result: SimResult = simulate(fleet, requests, "fcfs", CONFIG, 1)
    return {o.request_id: o.finish_s for o in result.outcomes if o.finish_s is not None}


def _requests(models: tuple[str, ...]) -> list[Request]:
    return [
        make_request(id=f"{m}-{k}", model=m, prompt_tokens=400, max_output_tokens=300)
        for m in models
        for k in range(4)
    ]


def test_engines_on_one_gpu_slow_each_other_only_while_both_are_busy() -> None:
    both = _requests(("m7b", "m13b"))
    apart, together = _ends(_fleet(False), both), _ends(_fleet(True), both)
    assert apart.keys() == together.keys() == {r.id for r in both}
    for request_id, end_s in apart.items():  # equal work at once: each at half speed
        assert together[request_id] == pytest.approx(2 * end_s, rel=0.05)
    one = _requests(("m7b",))
    assert _ends(_fleet(True), one) == pytest.approx(_ends(_fleet(False), one))


def _pair(kv_pool: bool, sibling: str | None) -> tuple[list[SimulatedEngine], SharedGpus]:
    """Two engines of 40 GiB each on one 80 GiB GPU: m7b, and `sibling` beside it."""
    profiles = [make_profile("m7b"), make_profile("m13b", weight_gib=26.0)]
    instances = [
        replace(
            make_instance(f"e{k}", memory_gib=40.0, loaded_model=model),
            slices=2,
            device="gpu0",
            kv_pool=kv_pool,
        )
        for k, model in enumerate(("m7b", sibling))
    ]
    fleet, clock = Fleet.of(instances, profiles), VirtualClock()
    engines = [SimulatedEngine(i, fleet, clock) for i in instances]
    shared = SharedGpus(Slot(i, e) for i, e in zip(instances, engines, strict=True))
    shared.retime(i.id for i in instances)
    return engines, shared


KIB_128 = 128 * 1024


def test_a_pool_lends_an_empty_sibling_s_memory_and_splits_what_is_free() -> None:
    (alone, _), _ = _pair(kv_pool=False, sibling=None)
    assert alone.kv_capacity_tokens == int((0.9 * 40 - 14) * GIB) // KIB_128  # its share
    (pooled, _), _ = _pair(kv_pool=True, sibling=None)
    assert pooled.kv_capacity_tokens == int((0.9 * 80 - 14) * GIB) // KIB_128  # the GPU's
    (first, second), _ = _pair(kv_pool=True, sibling="m13b")
    free_each = (0.9 * 80 - 14 - 26) * GIB / 2
    assert first.kv_capacity_tokens == int(free_each // KIB_128)
    assert second.kv_capacity_tokens == int(free_each // KIB_128)


def test_what_an_engine_holds_stays_its_own_and_the_rest_is_split_again() -> None:
    (first, second), shared = _pair(kv_pool=True, sibling="m13b")
    for k in range(8):
        first.submit(make_request(id=f"r{k}", model="m7b", prompt_tokens=4000))
    first.advance_to(0.0)
    held = first.kv_held()
    assert held > 4000  # a prompt admitted, its KV reserved
    shared.retime(["e0"])
    free_each = ((0.9 * 80 - 14 - 26) * GIB - held * KIB_128) / 2
    assert first.kv_capacity_tokens == held + int(free_each // KIB_128)
    assert second.kv_capacity_tokens == int(free_each // KIB_128)


def test_uneven_slices_hold_a_larger_model_beside_smaller_ones() -> None:
    group = {"gpu_type": "H100", "model": "vicuna-13b", "slices": 3, "kv_pool": True}
    config = FleetConfig.model_validate(
        {"instances": [group | {"slice_memory": [0.5, 0.25, 0.25]}]}
    )
    built = config.fleet(["vicuna-13b", "mistral-7b"])
    assert [i.gpu_memory_bytes for i in built.instances] == [40 * GIB, 20 * GIB, 20 * GIB]
    assert all(i.kv_pool for i in built.instances)
    assert built.can_serve(built.instances[1], "mistral-7b")
    assert not built.can_serve(built.instances[1], "vicuna-13b")


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"slices": 3, "slice_memory": [0.5, 0.5]}, "slice_memory"),
        ({"slices": 2, "slice_memory": [0.75, 0.5]}, "slice_memory"),
        ({"kv_pool": True}, "kv_pool"),
    ],
)
def test_slice_settings_that_cannot_hold_are_refused_naming_the_field(
    fields: dict[str, Any], loc: str
) -> None:
    group = {"gpu_type": "H100", "model": "mistral-7b"} | fields
    with pytest.raises(ValidationError, match=rf"instances\.0\.{loc}"):
        FleetConfig.model_validate({"instances": [group]})
