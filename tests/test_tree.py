"""The tree shows the architecture: one home per concept, so no two modules in different
packages share a name (three `scaling.py` files once held one concept in three places). A
package's own settings, command, protocol and types keep their role's name everywhere; the
few other pairs left are listed, so that a new one fails here and is named apart instead."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "qlm"
# One per package that has that role: its settings, its command, its protocol, its types.
ROLE_NAMES = {"config.py", "settings.py", "cli.py", "base.py", "types.py"}
# Pairs that remain, each with the two places (adding a third, or a new pair, fails).
KNOWN_PAIRS = {
    "store.py": {"batch", "programs"},  # where jobs, where programs are kept
    "runner.py": {"sim", "engine/native"},  # the simulator's run, the native engine's steps
    "listing.py": {"queue", "queue/redis"},  # the listing protocol and its Redis adapter
    "engine.py": {"engine/native", "engine/vllm"},  # one EngineClient per real engine kind
    "client.py": {"engine", "programs"},  # the engine protocol, the programs' HTTP client
}


def homes() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            found[path.name].add(str(path.parent.relative_to(PACKAGE)))
    return found


def test_no_two_packages_hold_modules_of_one_name() -> None:
    shared = {name: places for name, places in homes().items() if len(places) > 1}
    unexpected = {
        name: sorted(places)
        for name, places in shared.items()
        if name not in ROLE_NAMES and places != KNOWN_PAIRS.get(name)
    }
    assert unexpected == {}, f"name these modules apart: {unexpected}"


def test_the_known_pairs_are_still_pairs() -> None:
    """A pair renamed away must leave this list too, so that the list stays the truth."""
    found = homes()
    assert {name: found.get(name) for name in KNOWN_PAIRS} == KNOWN_PAIRS
