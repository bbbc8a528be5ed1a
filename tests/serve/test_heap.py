"""Freezing the startup heap: what a full collection walks afterwards is only what was
allocated since, so the API's event loop no longer stalls for a walk of every module's data
(qlm/serve/heap.py); cycles made later are still collected."""

from __future__ import annotations

import subprocess
import sys


def test_freezing_leaves_full_collections_only_the_objects_allocated_since() -> None:
    # A fresh interpreter: freezing this test process's heap would outlive the test.
    code = (
        "import gc, fastapi, pydantic, redis\n"
        "from qlm.serve.heap import freeze_startup_heap\n"
        "before = len(gc.get_objects())\n"
        "frozen = freeze_startup_heap()\n"
        "after = len(gc.get_objects())\n"
        "cycle = [{}]; cycle[0]['self'] = cycle; del cycle\n"
        "print(before, frozen, after, gc.isenabled(), gc.collect())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, frozen, after, enabled, collected = out.stdout.split()
    assert int(frozen) >= int(before) // 2  # the imported modules' objects, out of reach now
    assert int(after) < int(before) // 10  # what a full collection still walks
    assert (enabled, int(collected) >= 2) == ("True", True)  # the later cycle went
