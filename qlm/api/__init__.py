"""The HTTP API (FastAPI): OpenAI-compatible completions with SLO tags, asynchronous
submission, request state. See README.md."""

from qlm.api.app import create_app
from qlm.api.settings import ApiSettings, ModelInfo
from qlm.api.tokens import TOKEN_COUNTERS, TokenCounter

__all__ = ["TOKEN_COUNTERS", "ApiSettings", "ModelInfo", "TokenCounter", "create_app"]
