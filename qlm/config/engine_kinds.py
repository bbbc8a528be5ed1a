"""The engine kinds a fleet may run: a fleet file's `engine.kind`. Which OpenAI fields each
honours is in qlm/engine/openai_fields.py; qlm/serve/runtime.py's ENGINE_KINDS starts them."""

from typing import Literal

EngineKind = Literal["emulated", "vllm", "native"]  # the fleet file's engine.kind
