"""Pinned simulator outputs: `qlm simulate` on the shipped quick scenarios writes the very same
requests.csv (every request's instance, dispatch, first token, finish and outcome) as when the
digests below were taken. A refactor that changes a baseline's decisions, the engine model or
the event order by one request fails here.

The baselines (fcfs, edf, shepherd, llmd) must never move without a deliberate change to them.
The `qlm` digests move when the qlm policy is deliberately changed: re-pin them in the same
commit and say why in its message (`python -m tests.sim.test_pinned_outputs` prints them)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import sys
from pathlib import Path

import pytest

from qlm.cli import main

SIMS = Path(__file__).resolve().parents[2] / "sims"
BASELINES = ("fcfs", "edf", "shepherd", "llmd")
SEED = 0

# sha256 of requests.csv for `--policy fcfs --policy edf --policy shepherd --policy llmd`.
# Re-pinned (baselines and qlm) when requests.csv gained its last column, miss_cause: the files
# less that column were byte for byte the ones pinned before.
BASELINE_DIGESTS = {
    "wa-quick": "7af115264201fa201470ecb544c4f0be570ff5744c27e3d39cc35f2b58bae55d",
    "wb-quick": "bf333f8b53c1d5a33f58f3bda0f19aa19bc2dbe84f533d71798575faab2032cd",
    "wc-quick": "45bad0af30ebc28f8f8c6b6f18918404c8ba544819d3b8824ebc09ea882ca656",
}
# sha256 of requests.csv for `--policy qlm`. Re-pinned when the control driver landed: wb-quick
# unchanged; wa-quick and wc-quick move because an evicted request the plan forgot while it ran
# now rejoins its nearest group (as in the live loop) instead of forcing a re-plan, and the
# violation check's tick starts at the first arrival after an idle queue. Re-pinned again when
# dispatch within the plan landed (qlm/agents/dispatch.py): every qlm decision changed. And
# again when an arrival was offered only to instances whose room takes the request first in
# line (qlm/agents/room.py), and a schedule stood while joins fell past its window
# (qlm/agents/model_queues.py), requests past saving were set aside and overload was shed
# over the whole queue: wa-quick unchanged; wb-quick (queues past the window) and wc-quick
# (an arrival no longer makes an instance that is not its group's preempt) move. And again
# when dispatch stopped counting admitted decode as blocking a new request's first token
# (qlm/agents/drain.py start_blocks_by_rank, pooled by speed) and reconcile stopped evicting
# for a request the freed room cannot seat: wa-quick unchanged; wb-quick and wc-quick move.
# And again when the planner started from EDF improved by local search with a solver budget
# per request arrived since the last re-plan, and the simulator charged each plan that budget
# as its latency instead of the time limit: every scenario moves.
QLM_DIGESTS = {
    "wa-quick": "14e041945175626eb94663c6ea373bf3c163ef2b39517d38612b912717997772",
    "wb-quick": "285b95259b467989af644ff2bc14d948c19ec0f0e99cb6aa1e2fc14a28223795",
    "wc-quick": "10db4a35f9c27d3a4c62f7229c70af1fb7ce0cdd7a69b471c2ae60a13b183073",
}


def requests_csv_digest(scenario: str, policies: tuple[str, ...], out: Path) -> str:
    args = ["simulate", str(SIMS / f"{scenario}.yaml"), "--seed", str(SEED)]
    for policy in policies:
        args += ["--policy", policy]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*args, "--out", str(out), "--no-progress"]) == 0
    return hashlib.sha256((out / "requests.csv").read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(BASELINE_DIGESTS))
def test_baseline_outputs_are_pinned(scenario: str, tmp_path: Path) -> None:
    digest = requests_csv_digest(scenario, BASELINES, tmp_path)
    assert digest == BASELINE_DIGESTS[scenario]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(QLM_DIGESTS))
def test_qlm_outputs_are_pinned(scenario: str, tmp_path: Path) -> None:
    digest = requests_csv_digest(scenario, ("qlm",), tmp_path)
    assert digest == QLM_DIGESTS[scenario]


if __name__ == "__main__":  # print the current digests, to re-pin after a deliberate change
    import tempfile

    for name in sorted(BASELINE_DIGESTS):
        for label, policies in (("baselines", BASELINES), ("qlm", ("qlm",))):
            with tempfile.TemporaryDirectory() as tmp:
                print(name, label, requests_csv_digest(name, policies, Path(tmp)), file=sys.stdout)
