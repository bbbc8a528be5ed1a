"""The dispatch-wait benchmark's arithmetic: waits grouped per model and class, a request
without a dispatch time or answer counted against its row, and the target judged on the
worst wait of the interactive requests."""

from __future__ import annotations

from typing import Any

from benchmarks.dispatch_wait import KEYS, render, summarise

HEADER = {"command": "x", "date": "d", "machine": "m", "platform": "p", "code": "c"}


def sample(key: tuple[str, str], wait_ms: float | None, status: int = 200) -> dict[str, Any]:
    row: dict[str, Any] = {"model": key[0], "slo_class": key[1], "status": status}
    row["client_ms"] = 30.0
    if wait_ms is not None:
        row["dispatch_wait_ms"] = wait_ms
    return row


def test_the_worst_wait_of_each_model_and_class_is_judged() -> None:
    chat7, chat13, batch7, batch13 = KEYS
    samples = [sample(chat7, 2.0), sample(chat7, 4.0), sample(chat13, 3.0), sample(chat13, 780.0)]
    samples += [sample(batch7, 1.0), sample(batch13, None, status=503)]
    rows = {(r["model"], r["slo_class"]): r for r in summarise(samples)}
    assert rows[chat7]["dispatch_wait_max_ms"] == 4.0
    assert rows[chat13]["dispatch_wait_p50_ms"] == 3.0
    assert (rows[batch13]["requests"], rows[batch13]["ok"]) == (1, 0)
    text = render({"rows": list(rows.values()), "speedup": 20.0, "rounds": 2, **HEADER})
    assert "| dispatch wait <= 50 ms | mistral-7b, interactive | 4.0 ms (p50 2.0) | PASS |" in text
    late = "| dispatch wait <= 50 ms | vicuna-13b, interactive | 780.0 ms (p50 3.0) | MISS |"
    assert late in text
    assert "batch-2 | - |" not in text  # judged for interactive requests only
