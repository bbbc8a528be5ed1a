"""Many-model scenarios (qlm/sim/fuzz/many_models.py): a function of the seed, within their
bounds (2-4x more models than instances, each a renamed copy of a packaged profile that some
instance can hold, 300-1,500 requests), loadable by name, and a bad name is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from qlm.config import ConfigError
from qlm.sim.fuzz.choices import fitting_profiles
from qlm.sim.fuzz.many_models import draw_many_models, parse_many_name
from qlm.sim.scenario import load_scenario


@pytest.mark.parametrize("seed", range(6))
def test_a_draw_keeps_its_bounds(seed: int) -> None:
    draw = draw_many_models(seed)
    assert draw_many_models(seed).document == draw.document  # the seed alone decides
    scenario = load_scenario(Path(f"many:{seed}"))
    fleet = scenario.fleet()
    models = {stream.name for stream in scenario.workload}
    assert 2 * len(fleet.instances) - 1 <= len(models) <= 4 * len(fleet.instances) + 1
    for model in models:
        assert any(fleet.can_serve(i, model) for i in fleet.instances), model
        base = model.rsplit("-", 1)[0]
        copy = next(p for p in fleet.profiles.values() if p.model == model)
        packaged = fitting_profiles()[(base, copy.gpu_type)]
        assert (copy.load_s, copy.weight_bytes) == (packaged.load_s, packaged.weight_bytes)
    requests = scenario.requests(scenario.seed)
    assert 200 <= len(requests) <= 2000  # 300-1,500 expected
    shares = sorted(draw.model_shares.values(), reverse=True)
    assert shares[0] > 3 * shares[-1]  # Zipf: a head and a tail


def test_names() -> None:
    assert parse_many_name("many:12") == 12
    assert parse_many_name("random:12") is None
    with pytest.raises(ConfigError, match="many:SEED"):
        load_scenario(Path("many:x"))
