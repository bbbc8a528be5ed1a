"""The tree shows the architecture: one home per concept, so no two modules in different
packages share a name (three `scaling.py` files once held one concept in three places, and six
`config.py` files six packages' settings). A module's name says what it holds without its
folder: `serve_config.py`, `vllm_config.py`, `queue_protocol.py`, `engine_types.py`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "qlm"


def homes() -> dict[str, set[str]]:
    """Module file name -> the folders under qlm/ that hold one of that name."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            found[path.name].add(str(path.parent.relative_to(PACKAGE)))
    return found


def test_no_two_packages_hold_modules_of_one_name() -> None:
    shared = {name: sorted(places) for name, places in homes().items() if len(places) > 1}
    assert shared == {}, f"name these modules apart: {shared}"


def test_the_check_sees_every_package() -> None:
    """The walk reaches nested packages (a check that saw only the top level would pass)."""
    found = homes()
    assert found["vllm_config.py"] == {"config"}
    assert found["policy_base.py"] == {"sim/policies"}
    assert len(found) > 200
