"""Scenario fuzzing: random scenarios from a seed, to check the policies on workloads they were
never tuned to.

    throughput.py how many requests per second a fleet serves (analytic, from the profiles)
    choices.py    the random choices: models, streams (shape, mixes, lengths), fleet
    build.py      sizing the load from the capacity, and the scenario's document
    many_models.py  many models on few GPUs (copies of packaged profiles), `many:SEED`

qlm.sim.scenario.random_scenario(seed, size) validates a draw into a Scenario.

`qlm simulate random:SEED` (or `random:SEED:tiny`) simulates one: load_scenario accepts the
name in place of a file.
"""

from qlm.sim.fuzz.build import SIZES, FuzzDraw, FuzzSize, draw_scenario

RANDOM_PREFIX = "random:"


def parse_random_name(name: str) -> tuple[int, str] | None:
    """'random:SEED' or 'random:SEED:SIZE' -> (seed, size); None for any other name.
    ValueError for a malformed one."""
    if not name.startswith(RANDOM_PREFIX):
        return None
    seed_text, _, size = name[len(RANDOM_PREFIX) :].partition(":")
    if not seed_text.isdigit():
        raise ValueError(f"{name}: expected random:SEED or random:SEED:SIZE with SEED >= 0")
    size = size or "quick"
    if size not in SIZES:
        raise ValueError(f"{name}: unknown size {size!r}; known: {', '.join(SIZES)}")
    return int(seed_text), size


__all__ = [
    "RANDOM_PREFIX",
    "SIZES",
    "FuzzDraw",
    "FuzzSize",
    "draw_scenario",
    "parse_random_name",
]
