"""Shared prompt prefixes in workloads (qlm/sim/workload/prefixes.py): the shared-text
generator, the Mooncake block ids, the oracle's reuse, and what a run reports."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from qlm.sim.workload import StreamConfig, iter_requests
from qlm.sim.workload.prefixes import oracle_hits, oracle_reuse
from qlm.types import DEFAULT_SLO_CLASSES, PrefixBlock, Request

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "sims" / "data" / "mooncake_conversation.jsonl"
AZURE = ROOT / "sims" / "data" / "azure_llm_2023_conv.csv"
CLASSES = {c.name: c for c in DEFAULT_SLO_CLASSES}
LEVELS = [
    {"name": "system", "count": 5, "tokens": 1000, "zipf": 1.0},
    {"name": "document", "count": 3, "tokens": 400, "zipf": 0.0},
]


def stream(**fields: Any) -> StreamConfig:
    data: dict[str, Any] = {
        "name": "s",
        "arrivals": {"process": "poisson", "rate_per_s": 50.0},
        "count": 2000,
        "models": {"m": 1},
        "classes": {"interactive": 1},
        "lengths": {"source": "fixed", "prompt_tokens": 100, "output_tokens": 10},
    }
    data.update(fields)
    return StreamConfig.model_validate(data)


def requests(*specs: StreamConfig, seed: int = 0) -> list[Request]:
    return list(iter_requests(specs, seed, CLASSES))


def test_shared_levels_go_in_front_of_each_prompt_and_chain_their_keys() -> None:
    reqs = requests(stream(prefixes={"source": "shared", "levels": LEVELS}))
    assert {r.prompt_tokens for r in reqs} == {1500}
    assert {tuple(b.tokens for b in r.prefix) for r in reqs} == {(1000, 400)}
    firsts = Counter(r.prefix[0].key for r in reqs)
    assert len(firsts) == 5
    # Zipf 1: the most popular of 5 texts takes 1 / (1 + 1/2 + ... + 1/5) = 44 % of requests
    assert max(firsts.values()) / len(reqs) == pytest.approx(0.438, abs=0.04)
    # 3 documents under each system prompt, each keyed by its parent too: 15 distinct
    assert len({r.prefix[1].key for r in reqs}) == 15


def test_prefixes_shift_no_other_draw_and_repeat_with_the_seed() -> None:
    plain = requests(stream())
    shared = requests(stream(prefixes={"source": "shared", "levels": LEVELS}))
    assert [r.arrival_at_s for r in plain] == [r.arrival_at_s for r in shared]
    again = requests(stream(prefixes={"source": "shared", "levels": LEVELS}))
    assert [r.prefix for r in shared] == [r.prefix for r in again]
    other_seed = requests(stream(prefixes={"source": "shared", "levels": LEVELS}), seed=1)
    assert [r.prefix for r in shared] != [r.prefix for r in other_seed]


def test_a_namespace_shares_texts_across_streams() -> None:
    spec = {"source": "shared", "levels": LEVELS[:1], "namespace": "app"}
    a = requests(stream(name="a", prefixes=spec), stream(name="b", prefixes=spec))
    keys_a = {r.prefix[0].key for r in a if r.id.startswith("a-")}
    keys_b = {r.prefix[0].key for r in a if r.id.startswith("b-")}
    assert keys_a == keys_b
    apart = requests(stream(name="a", prefixes={"source": "shared", "levels": LEVELS[:1]}))
    assert not keys_a & {r.prefix[0].key for r in apart}


def test_mooncake_rows_keep_their_blocks() -> None:
    spec = stream(
        arrivals={"process": "trace", "path": str(MOONCAKE), "format": "mooncake"},
        count=200,
        lengths={"source": "replay"},
        prefixes={"source": "trace"},
    )
    reqs = requests(spec)
    for r in reqs:
        assert sum(b.tokens for b in r.prefix) == r.prompt_tokens
        assert all(b.tokens == 512 for b in r.prefix[:-1])
    # the trace's first rows all open with block id 0: one shared first key
    assert len({r.prefix[0].key for r in reqs[:2]}) == 1
    assert reqs[0].prefix[1].key != reqs[1].prefix[1].key


def test_trace_prefixes_need_a_trace_with_block_ids() -> None:
    with pytest.raises(ValidationError, match="format mooncake"):
        stream(
            lengths={"source": "trace", "path": str(AZURE), "format": "azure"},
            prefixes={"source": "trace"},
        )
    with pytest.raises(ValidationError, match="format mooncake"):
        stream(prefixes={"source": "trace"})


def test_the_oracle_hits_leading_blocks_seen_before_only() -> None:
    a, b, c = PrefixBlock(1, 100), PrefixBlock(2, 50), PrefixBlock(3, 70)
    rows = [(200, (a, b)), (200, (a, b)), (200, (a, c)), (200, (c,)), (200, (b,))]
    # second: both blocks; third: a only (c is new); fourth and fifth: a key seen before hits
    # wherever it was seen (keys name the text up to the block's end, so in real workloads a
    # key only ever follows the same blocks)
    assert oracle_hits(blocks for _, blocks in rows) == [0, 150, 100, 70, 50]
    assert oracle_reuse(rows) == (1000, 370)


def test_a_run_reports_prefix_reuse_beside_the_oracle(tmp_path: Path) -> None:
    from qlm.cli import main

    scenario = ROOT / "sims" / "prefix-quick.yaml"
    text = scenario.read_text().replace("duration_s: 120", "duration_s: 15")
    small = tmp_path / "prefix-small.yaml"
    small.write_text(text.replace("path: data/", f"path: {ROOT / 'sims' / 'data'}/"))
    out = tmp_path / "out"
    assert (
        main(["simulate", str(small), "--policy", "fcfs", "--no-progress", "--out", str(out)]) == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    reuse = summary["policies"]["fcfs"]["prefix"]
    oracle = summary["prefix_oracle_reuse"]
    assert 0.3 < reuse["reuse"] <= oracle < 1.0
    assert reuse["hit_tokens"] == pytest.approx(reuse["reuse"] * reuse["prompt_tokens"])
    assert set(reuse["by_instance"]) == {
        "a10-mistral-7b-0",
        "a10-mistral-7b-1",
        "a100-mistral-7b-0",
        "a100-mistral-7b-1",
        "a100-mistral-7b-2",
    }
    report = (out / "report.md").read_text()
    section = report.split("## Prefix reuse", 1)[1]
    assert f"Oracle: {100 * oracle:.1f}%" in section
    assert f"| fcfs | {reuse['prompt_tokens']} | {reuse['hit_tokens']} |" in section


def test_a_run_without_prefixes_reports_no_reuse() -> None:
    from qlm.config import QlmConfig
    from qlm.sim.simulate import simulate
    from tests.factories import make_request
    from tests.sim.cases import two_model_fleet

    result = simulate(two_model_fleet(1, 0), [make_request()], "fcfs", QlmConfig(), seed=0)
    assert result.prefix_reuse() is None
    assert set(result.prefix_tokens.values()) == {(0, 0)}
