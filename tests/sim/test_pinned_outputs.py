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
BASELINE_DIGESTS = {
    "wa-quick": "f0f0657cefba97839158b990257e31be55c71013bffb79134d1e3fc1516d63b6",
    "wb-quick": "635e329c393cc3dd3094a122ed7f4c3b0634ba59ea0a3acc9de81caf9dc71463",
    "wc-quick": "7f33542f7c352d539aa2e5892f2b2cda61d46d6aed9a64f90c8fea8be7c50cce",
}
# sha256 of requests.csv for `--policy qlm`. Re-pinned when the control driver landed: wb-quick
# unchanged; wa-quick and wc-quick move because an evicted request the plan forgot while it ran
# now rejoins its nearest group (as in the live loop) instead of forcing a re-plan, and the
# violation check's tick starts at the first arrival after an idle queue.
QLM_DIGESTS = {
    "wa-quick": "22a27efc6f860dc27436dd6c44d2194d995365395fd76f2f43969ee029827945",
    "wb-quick": "2404b27c6e597852cd708520b8443730d6c3648ccff6bfbee3134f0e26a201e5",
    "wc-quick": "08e10374162e16e90d50c834d81d0d5bed049883c254492cee3ea506d60fdd23",
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
