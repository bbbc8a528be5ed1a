"""The tree shows the architecture: one home per concept, so no two modules in different
packages share a name (three `scaling.py` files once held one concept in three places). A
package's own settings, command, protocol and types keep their role's name everywhere; any
other pair fails here and is named apart instead."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "qlm"
# One per package that has that role: its settings, its command, its protocol, its types.
ROLE_NAMES = {"config.py", "settings.py", "cli.py", "base.py", "types.py"}


def homes() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            found[path.name].add(str(path.parent.relative_to(PACKAGE)))
    return found


def test_no_two_packages_hold_modules_of_one_name() -> None:
    shared = {name: places for name, places in homes().items() if len(places) > 1}
    unexpected = {name: sorted(places) for name, places in shared.items() if name not in ROLE_NAMES}
    assert unexpected == {}, f"name these modules apart: {unexpected}"
