"""Engines behind one contract: the protocol an agent drives (`EngineClient`, client.py) and
what every engine reports (engine_types.py); the engine model (model/: what an engine does,
iteration by iteration, pure) and its two clocks' clients (simulated.py, emulated.py); the
real engines (vllm/, native/); and where profiles come from (profiling/). The performance
model they share is qlm.perf. README.md says which file answers what. Import from the
modules."""
