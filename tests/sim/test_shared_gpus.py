"""Engines that share GPUs (an instance group's `slices`): the fleet splits the memory, the
engines take turns on the compute (qlm/sim/sharing.py), the live plane refuses it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from qlm.engine.types import RequestFinished
from qlm.fleet_config import FleetConfig
from qlm.perf.profile import GIB
from qlm.serve.config import ServeConfig
from qlm.sim.result import SimResult
from qlm.sim.runner import simulate
from qlm.types import Fleet, Instance, Request
from tests.engine.helpers import engine, req, run_all
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


def test_a_model_that_does_not_fit_its_slice_is_refused_naming_the_slices() -> None:
    with pytest.raises(ValidationError, match=r"1/3 of the memory"):
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
    alone, shared, late = engine(), engine(), engine()
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
