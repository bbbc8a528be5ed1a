"""Engines behind one contract (EngineClient, client.py; what they report: types.py): the engine
model (model.py and its parts) on a virtual clock (simulated) or on the wall clock (emulated),
and vLLM (vllm/). Profiles and profiling: profiling/. The performance model they share is
qlm.perf. README.md says which file answers what. Import from the modules."""
