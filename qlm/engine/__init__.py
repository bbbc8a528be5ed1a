"""Engines behind one contract (EngineClient): the engine model on a virtual clock (simulated)
or on the wall clock (emulated), and vLLM. The performance model they share is qlm.perf.
Import engines from their modules."""
