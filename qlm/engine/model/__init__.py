"""The engine model: what an engine does with its requests, iteration by iteration, on
passed-in time (pure: no clock, no I/O). The simulator runs it on a virtual clock
(qlm/engine/simulated.py) and the emulated engines on the wall clock (qlm/engine/emulated.py).
`core.py` is the facade (`EngineModel`); the files beside it are its parts
(qlm/engine/README.md). Import from the modules."""
