"""The collection guard of tests/conftest.py: under pytest-xdist, items sharing a node id run
once, so sharing one is refused unless the items are marked `one_process`."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.conftest import shared_ids


class Item:
    """What the guard reads of a collected item: its node id and its markers."""

    def __init__(self, nodeid: str, *markers: str) -> None:
        self.nodeid = nodeid
        self._markers = markers

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self._markers else None


def items(*made: Item) -> list[pytest.Item]:
    return cast(list[pytest.Item], list(made))


def test_a_node_id_shared_by_unmarked_items_is_refused_by_name() -> None:
    with pytest.raises(pytest.UsageError, match=r"t\.py::test_fuzz"):
        shared_ids(items(Item("t.py::test_fuzz"), Item("t.py::test_fuzz"), Item("t.py::other")))


def test_marked_shared_ids_and_distinct_ids_pass() -> None:
    shared_ids(
        items(Item("t.py::test_fuzz", "one_process"), Item("t.py::test_fuzz", "one_process"))
    )
    shared_ids(items(Item("t.py::a"), Item("t.py::b")))
