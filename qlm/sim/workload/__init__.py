"""Workloads: streams of requests with an arrival process, a rate shape, lengths and mixes.

A workload is a list of streams (`StreamConfig`); each file answers one question:

    stream.py     what is one stream (StreamConfig and its consistency rules)
    arrivals.py   when do its requests arrive (poisson, gamma, trace, backlog; ramps, bursts)
    rates.py      how a rate varies over time (RateProfile, the time-change method)
    lengths.py    how long are prompts and outputs (fixed, trace, replay)
    generate.py   which requests come out, in what order (seeded per component, lazy merge)
    paths.py      where the trace files a scenario names live (qlm.config.relative_to)
"""

from qlm.sim.workload.arrivals import (
    CHUNK,
    Arrivals,
    BacklogArrivals,
    BurstConfig,
    GammaArrivals,
    PoissonArrivals,
    RampConfig,
    TraceArrivals,
)
from qlm.sim.workload.generate import (
    StreamChunk,
    component_rng,
    iter_requests,
    stream_chunks,
    stream_requests,
)
from qlm.sim.workload.lengths import FixedLengths, Lengths, ReplayLengths, TraceLengths
from qlm.sim.workload.rates import RateProfile
from qlm.sim.workload.stream import StreamConfig

__all__ = [
    "CHUNK",
    "Arrivals",
    "BacklogArrivals",
    "BurstConfig",
    "FixedLengths",
    "GammaArrivals",
    "Lengths",
    "PoissonArrivals",
    "RampConfig",
    "RateProfile",
    "ReplayLengths",
    "StreamChunk",
    "StreamConfig",
    "TraceArrivals",
    "TraceLengths",
    "component_rng",
    "iter_requests",
    "stream_chunks",
    "stream_requests",
]
