"""The HTTP API (FastAPI): OpenAI-compatible completions with SLO tags, asynchronous
submission, request state. See README.md."""

from qlm.api.app import create_app
from qlm.api.tokens import TOKEN_COUNTERS, TokenCounter
from qlm.config.api_settings import ApiAppConfig, ApiConfig, ModelConfig

__all__ = [
    "TOKEN_COUNTERS",
    "ApiAppConfig",
    "ApiConfig",
    "ModelConfig",
    "TokenCounter",
    "create_app",
]
