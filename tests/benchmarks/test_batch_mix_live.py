"""The live batch-mix benchmark on a shrunk batch-mix scenario: the job's file goes through the
Batch API with shared texts where the scenario shares prefixes, every line is answered, and
the interactive stream is measured at the client and at the server."""

from __future__ import annotations

import json

from benchmarks.batch_mix_live import JOB_CLASS, job_file, run_live, verdict
from benchmarks.report import ROOT
from qlm.sim.scenario import Scenario, load_scenario


def small() -> Scenario:
    scenario = load_scenario(ROOT / "sims" / "batch-mix.yaml")
    chat, job = scenario.workload
    chat = chat.model_copy(update={"duration_s": 20.0, "bursts": ()})
    job = job.model_copy(update={"count": 24})
    return scenario.model_copy(update={"workload": (chat, job)})


def test_the_job_file_shares_text_where_the_scenario_shares_prefixes() -> None:
    job = [r for r in small().requests(1) if r.slo_class == JOB_CLASS]
    prompts = [json.loads(line)["body"]["prompt"] for line in job_file(job).splitlines()]
    by_document: dict[int, set[str]] = {}
    for request, prompt in zip(job, prompts, strict=True):
        shared_tokens = sum(b.tokens for b in request.prefix)
        by_document.setdefault(request.prefix[-1].key, set()).add(prompt[: 4 * shared_tokens])
        assert len(prompt) == 4 * request.prompt_tokens
    assert all(len(texts) == 1 for texts in by_document.values())  # one text per document
    assert len({p[:1200] for p in prompts}) == 1  # one instruction block for all


async def test_a_small_live_run_answers_every_line_and_every_chat() -> None:
    row = await run_live(small(), 1, 20.0, with_job=True)
    assert row["job status"] == "completed"
    assert row["job done"] == 1.0
    assert row["interactive"] > 10
    assert row["p99 ttft_s (client)"] is not None
    judged = verdict(row, row)
    assert judged["interactive p99 / alone"] == 1.0
