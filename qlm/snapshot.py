"""A planning snapshot file: a fleet (qlm/config/fleet_config.py), the work already running on it
and a synthetic queue, validated by pydantic.

Used by `qlm plan` (the embedded main job) to run grouping, estimation and planning once."""

from __future__ import annotations

import random
from collections.abc import Iterator
from types import MappingProxyType

from pydantic import Field, NonNegativeFloat, model_validator

from qlm.config import Problem, QlmConfig, StrictModel, fail_at
from qlm.config.fleet_config import FleetConfig
from qlm.types import Fleet, Request, SloClass


class RequestBatchConfig(StrictModel):
    """`count` requests of one model and SLO class arriving uniformly over `arrival_window_s`
    before the snapshot, with lognormal prompt lengths."""

    model: str = Field(min_length=1)
    slo_class: str = Field(min_length=1)
    count: int = Field(ge=1, le=1_000_000)
    prompt_tokens_median: int = Field(default=1000, ge=1)
    max_output_tokens: int = Field(default=512, ge=1)
    arrival_window_s: float = Field(default=10.0, ge=0)


class Snapshot(StrictModel):
    moved_fields = MappingProxyType(
        {
            "instances": "moved to fleet.instances",
            "profiles": "moved to fleet.profiles (in the profile file format)",
        }
    )

    now_s: float = 0.0
    seed: int = 0
    config: QlmConfig = Field(default_factory=QlmConfig)
    fleet_config: FleetConfig = Field(alias="fleet", description="Instances and profiles.")
    busy_s: dict[str, NonNegativeFloat] = Field(
        default_factory=dict,
        description="Seconds of work already in an instance's engine, by instance id or by "
        "group id (each instance of the group); others are idle.",
    )
    requests: tuple[RequestBatchConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Snapshot:
        problems = list(self._problems())
        if problems:
            fail_at("Snapshot", problems)
        return self

    def _problems(self) -> Iterator[Problem]:
        fleet = self.fleet()
        classes = {c.name for c in self.config.slo_classes}
        for i, batch in enumerate(self.requests):
            if not self.fleet_config.can_serve(batch.model, fleet):
                yield (
                    ("requests", i, "model"),
                    f"no GPU type in the fleet can serve {batch.model!r} (no profile, or it "
                    "does not fit)",
                )
            if batch.slo_class not in classes:
                yield ("requests", i, "slo_class"), f"{batch.slo_class!r} not in {sorted(classes)}"
        groups = {g.prefix for g in self.fleet_config.instances}
        ids = {inst.id for inst in fleet.instances}
        for name in self.busy_s:
            if name not in ids and name not in groups:
                yield ("busy_s", name), "not an instance or group id of the fleet"

    @property
    def models(self) -> set[str]:
        """Every model the snapshot names: queued, loaded or profiled inline."""
        found = {b.model for b in self.requests}
        found |= {g.model for g in self.fleet_config.instances if g.model is not None}
        return found | {p.model for p in self.fleet_config.profiles}

    def fleet(self) -> Fleet:
        return self.fleet_config.fleet(self.models)

    def busy_s_by_instance(self) -> dict[str, float]:
        """busy_s by instance id (a group's entry applies to each of its instances)."""
        out: dict[str, float] = {}
        for group in self.fleet_config.instances:
            for inst_id in group.instance_ids():
                out[inst_id] = self.busy_s.get(inst_id, self.busy_s.get(group.prefix, 0.0))
        return out

    def queued_requests(self) -> list[Request]:
        rng = random.Random(self.seed)
        classes: dict[str, SloClass] = self.config.slo_class_map()
        out: list[Request] = []
        for b, batch in enumerate(self.requests):
            for k in range(batch.count):
                arrival = self.now_s - rng.uniform(0.0, batch.arrival_window_s)
                prompt = max(1, int(rng.lognormvariate(0.0, 0.6) * batch.prompt_tokens_median))
                out.append(
                    Request.create(
                        f"r{b}-{k}",
                        batch.model,
                        prompt,
                        batch.max_output_tokens,
                        classes[batch.slo_class],
                        arrival,
                    )
                )
        return out
