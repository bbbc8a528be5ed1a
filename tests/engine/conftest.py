"""The `engine_factory` fixture: one parameter per EngineClient implementation, keyed by name
(tests/engine/harness.py: ENGINE_FACTORIES, ENGINE_MARKS)."""

from __future__ import annotations

import pytest

from tests.engine.harness import ENGINE_FACTORIES, ENGINE_MARKS, HarnessFactory


@pytest.fixture(
    params=[pytest.param(name, marks=ENGINE_MARKS.get(name, [])) for name in ENGINE_FACTORIES]
)
def engine_factory(request: pytest.FixtureRequest) -> HarnessFactory:
    return ENGINE_FACTORIES[str(request.param)]
