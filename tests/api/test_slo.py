"""SLO tags: precedence (body > x-qlm headers > llm-d header > default class), tightening,
and deadlines computed from the injected clock."""

from __future__ import annotations

import httpx
import pytest

from qlm.api.errors import ApiError
from qlm.api.slo import SloResolver, SloTags
from qlm.clock import VirtualClock
from qlm.queue.memory import MemoryQueue
from tests.api.conftest import CLASSES, NOW_S

RESOLVER = SloResolver({c.name: c.to_slo_class() for c in CLASSES}, "interactive", 86_400.0)


@pytest.mark.parametrize(
    ("tags", "headers", "expected"),
    [
        pytest.param(SloTags(), {}, ("interactive", 20.0, None), id="untagged-default"),
        pytest.param(SloTags("batch-1"), {}, ("batch-1", 60.0, None), id="body-class"),
        pytest.param(
            SloTags(), {"x-qlm-slo-class": "batch-2"}, ("batch-2", 3600.0, 7200.0), id="header"
        ),
        pytest.param(
            SloTags("batch-1"),
            {"x-qlm-slo-class": "batch-2"},
            ("batch-1", 60.0, None),
            id="body-beats-header",
        ),
        pytest.param(
            SloTags(),
            {"x-qlm-slo-ttft-ms": "5000", "x-llm-d-slo-ttft-ms": "1000"},
            ("interactive", 5.0, None),
            id="qlm-ttft-beats-llmd",
        ),
        pytest.param(
            SloTags(), {"x-llm-d-slo-ttft-ms": "1500"}, ("interactive", 1.5, None), id="llmd"
        ),
        pytest.param(
            SloTags(slo_ttft_s=2.0),
            {"x-qlm-slo-ttft-ms": "500"},
            ("interactive", 2.0, None),
            id="body-ttft-beats-header",
        ),
        pytest.param(
            SloTags(slo_ttft_s=100.0), {}, ("interactive", 20.0, None), id="looser-ttft-capped"
        ),
        pytest.param(
            SloTags("batch-1", slo_ttft_s=30.0), {}, ("batch-1", 30.0, None), id="ttft-tightens"
        ),
        pytest.param(
            SloTags(deadline_s=10.0), {}, ("interactive", 10.0, 10.0), id="deadline-caps-ttft"
        ),
        pytest.param(
            SloTags("batch-2", deadline_s=5000.0),
            {},
            ("batch-2", 3600.0, 5000.0),
            id="deadline-tightens-completion",
        ),
        pytest.param(
            SloTags("batch-2", deadline_s=9000.0),
            {},
            ("batch-2", 3600.0, 7200.0),
            id="deadline-looser-than-class",
        ),
    ],
)
def test_precedence_and_tightening(
    tags: SloTags, headers: dict[str, str], expected: tuple[str, float, float | None]
) -> None:
    name, ttft_s, completion_s = expected
    got = RESOLVER.resolve(tags, headers, now_s=500.0)
    assert got.slo.name == name
    assert got.ttft_deadline_at_s == 500.0 + ttft_s
    if completion_s is None:
        assert got.completion_deadline_at_s is None
    else:
        assert got.completion_deadline_at_s == 500.0 + completion_s


@pytest.mark.parametrize(
    ("tags", "headers", "param"),
    [
        (SloTags("gold"), {}, "slo_class"),
        (SloTags(), {"x-qlm-slo-class": "gold"}, "x-qlm-slo-class"),
        (SloTags(slo_ttft_s=1e9), {}, "slo_ttft_s"),
        (SloTags(deadline_s=1e9), {}, "deadline_s"),
        (SloTags(), {"x-qlm-slo-ttft-ms": "soon"}, "x-qlm-slo-ttft-ms"),
        (SloTags(), {"x-qlm-slo-ttft-ms": "0"}, "x-qlm-slo-ttft-ms"),
        (SloTags(), {"x-llm-d-slo-ttft-ms": "-5"}, "x-llm-d-slo-ttft-ms"),
        (SloTags(), {"x-llm-d-slo-ttft-ms": "nan"}, "x-llm-d-slo-ttft-ms"),
        (SloTags(), {"x-llm-d-slo-ttft-ms": "inf"}, "x-llm-d-slo-ttft-ms"),
    ],
)
def test_bad_tags_name_their_source(tags: SloTags, headers: dict[str, str], param: str) -> None:
    with pytest.raises(ApiError) as err:
        RESOLVER.resolve(tags, headers, now_s=0.0)
    assert (err.value.status, err.value.param) == (400, param)


def test_header_ignored_when_body_sets_the_value() -> None:
    """A broken header does not matter when the body gives that tag."""
    got = RESOLVER.resolve(SloTags(slo_ttft_s=3.0), {"x-qlm-slo-ttft-ms": "junk"}, 0.0)
    assert got.ttft_deadline_at_s == 3.0


async def test_deadlines_follow_the_injected_clock(
    client: httpx.AsyncClient, queue: MemoryQueue, clock: VirtualClock
) -> None:
    body = {"kind": "completion", "model": "m7b", "prompt": "x", "deadline_s": 45.0}
    first = (await client.post("/v1/qlm/requests", json=body)).json()
    clock.advance_by(250.0)
    second = (
        await client.post("/v1/qlm/requests", json=body, headers={"X-QLM-SLO-Class": "batch-1"})
    ).json()
    a, b = await queue.get(first["id"]), await queue.get(second["id"])
    assert a is not None
    assert b is not None
    assert a.request.arrival_at_s == NOW_S
    assert (a.request.slo_class, a.request.ttft_deadline_at_s) == ("interactive", NOW_S + 20.0)
    assert a.request.completion_deadline_at_s == NOW_S + 45.0
    assert b.request.arrival_at_s == NOW_S + 250.0
    assert b.request.slo_class == "batch-1"  # header names are case-insensitive
    assert b.request.ttft_deadline_at_s == NOW_S + 250.0 + 45.0  # the deadline caps 60 s
    assert second["times"]["completion_deadline_at_s"] == NOW_S + 250.0 + 45.0
