"""A real vLLM server behind the EngineClient protocol (VllmEngine, vllm_engine.py).

Question answered: how does QLM run and talk to vLLM? One file per part (README.md in
qlm/engine): its settings and command line (vllm_config.py), the server process over its life
(process.py), the OpenAI completion requests and their SSE streams on the wire (protocol.py),
the streaming HTTP client (request_streams.py), /metrics parsing (metrics.py), and the EngineClient
that ties them together (vllm_engine.py). Import from the modules.
"""
