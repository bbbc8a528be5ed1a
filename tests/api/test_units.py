"""Pure parts of the API: token counters, chat flattening, the token forwarder across
attempts, output caps, settings validation and error parameter paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from qlm.api import ApiAppConfig, ModelConfig
from qlm.api.admission import Admitter
from qlm.api.errors import ApiError, param_of
from qlm.api.schemas import ChatBody, CompletionBody
from qlm.api.streaming import TokenForwarder
from qlm.api.tokens import TOKEN_COUNTERS, flatten_chat, make_token_counter
from qlm.config import ConfigError, QlmConfig, load_yaml_model
from qlm.config.api_settings import ApiConfig
from qlm.queue.records import RequestResult, StreamEvent, StreamKind
from qlm.registry import UnknownPolicyError
from qlm.types import RequestState
from tests.api.conftest import make_settings


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 1), ("abcd", 1), ("abcde", 2), ("é", 1), ("€€", 2), ("x" * 4000, 1000)],
)
def test_utf8_bytes_counter(text: str, tokens: int) -> None:
    assert make_token_counter("utf8-bytes").count(text) == tokens


def test_whitespace_counter() -> None:
    counter = make_token_counter("whitespace")
    assert counter.count("one two\tthree\nfour") == 4
    assert counter.count("   ") == 1


def test_unknown_counter_lists_known() -> None:
    with pytest.raises(UnknownPolicyError, match="utf8-bytes, whitespace"):
        make_token_counter("tiktoken")
    assert TOKEN_COUNTERS.names() == ["utf8-bytes", "whitespace"]


def test_flatten_chat_tags_roles() -> None:
    text = flatten_chat([("system", "Be brief."), ("user", "Hi")])
    assert text == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"


def test_chat_content_parts_join() -> None:
    body = ChatBody.model_validate(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
            ],
        }
    )
    assert body.prompt_text() == "<|user|>\nab\n<|assistant|>\n\n<|assistant|>\n"


def tokens(attempt: int, offset: int, text: str, num: int = 1) -> StreamEvent:
    return StreamEvent("r", StreamKind.TOKENS, attempt, 0.0, text, num, offset)


def feed_all(events: list[StreamEvent]) -> list[str]:
    forwarder = TokenForwarder()
    return [forwarder.feed(e) for e in events]


def test_forwarder_passes_a_single_attempt_through() -> None:
    assert feed_all([tokens(1, 0, "a"), tokens(1, 1, "b"), tokens(1, 2, "cd", 2)]) == [
        "a",
        "b",
        "cd",
    ]


def test_forwarder_skips_a_replayed_prefix() -> None:
    events = [
        tokens(1, 0, "a"),
        tokens(1, 1, "b"),
        StreamEvent("r", StreamKind.REQUEUED, 1, 0.0),
        tokens(2, 0, "a"),
        tokens(2, 1, "b"),
        tokens(2, 2, "c"),
    ]
    out = feed_all([e for e in events if e.kind is StreamKind.TOKENS])
    assert out == ["a", "b", "", "", "c"]


def test_forwarder_cuts_a_straddling_chunk_by_characters() -> None:
    out = feed_all([tokens(1, 0, "ab ", 2), tokens(2, 0, "ab cd ", 4)])
    assert out == ["ab ", "cd "]


def test_forwarder_drops_late_chunks_of_an_old_attempt() -> None:
    out = feed_all([tokens(1, 0, "a"), tokens(2, 0, "a"), tokens(2, 1, "b"), tokens(1, 1, "b")])
    assert out == ["a", "", "b", ""]


def test_forwarder_keeps_text_without_token_counts() -> None:
    assert feed_all([tokens(1, 0, "a"), tokens(1, 1, "!", 0)]) == ["a", "!"]


def test_forwarder_appends_result_text_beyond_the_stream() -> None:
    forwarder = TokenForwarder()
    forwarder.feed(tokens(1, 0, "ab"))
    result = RequestResult("r", RequestState.COMPLETED, "i", text="abcd")
    assert forwarder.rest_of(result) == "cd"
    assert forwarder.text == "abcd"
    other = RequestResult("r", RequestState.COMPLETED, "i", text="xyz")
    assert forwarder.rest_of(other) == ""


def build(body: dict[str, object], **settings: object) -> int:
    admitter = Admitter(make_settings(**settings), make_token_counter("utf8-bytes"))
    parsed = CompletionBody.model_validate({"model": "m7b", "prompt": "abcd", **body})
    return admitter.build(parsed, {}, "r1", 0.0).max_output_tokens


def test_output_cap_defaults_within_the_context() -> None:
    assert build({}) == 64  # default_max_tokens
    assert build({"max_tokens": 4095}) == 4095  # 1 prompt token + 4095 = the context
    room = 4096 - 2000
    assert build({"prompt": "x" * 8000}, default_max_tokens=3000) == room
    with pytest.raises(ApiError) as err:
        build({"max_tokens": 4096})
    assert err.value.param == "max_tokens"


def test_request_fields_from_body() -> None:
    admitter = Admitter(make_settings(), make_token_counter("whitespace"))
    body = CompletionBody.model_validate({"model": "m13b", "prompt": "a b c", "user": "team-x"})
    request = admitter.build(body, {}, "r9", 5.0)
    assert (request.id, request.model, request.prompt_tokens) == ("r9", "m13b", 3)
    assert (request.tenant, request.prompt, request.arrival_at_s) == ("team-x", "a b c", 5.0)
    assert request.state is RequestState.QUEUED


def test_settings_validation() -> None:
    with pytest.raises(ValidationError, match="default_slo_class"):
        make_settings(default_slo_class="gold")
    with pytest.raises(ValidationError):
        make_settings(models=())
    with pytest.raises(ValidationError):
        make_settings(surprise=1)
    with pytest.raises(ValidationError):
        ModelConfig(max_context_tokens=0)


def test_settings_from_qlm_config() -> None:
    config = QlmConfig.model_validate(
        {"slo_classes": [{"name": "fast", "ttft_s": 1.0}], "default_slo_class": "fast"}
    )
    settings = ApiAppConfig.from_config(
        config, [ModelConfig(name="m", max_context_tokens=100)], ApiConfig(completion_timeout_s=5.0)
    )
    assert list(settings.slo_class_map()) == ["fast"]
    assert settings.default_slo_class == "fast"
    assert settings.api.completion_timeout_s == 5.0


@pytest.mark.parametrize(
    ("loc", "param"),
    [
        (("messages", 0, "content"), "messages[0].content"),
        (("prompt", "list[str]", 0), "prompt[0]"),
        (("messages", 0, "content", "list[TextPart]", 1, "type"), "messages[0].content[1].type"),
        (("max_tokens",), "max_tokens"),
        ((), None),
    ],
)
def test_param_paths(loc: tuple[int | str, ...], param: str | None) -> None:
    assert param_of(loc) == param


def test_settings_load_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "api.yaml"
    path.write_text(
        "models:\n  - {name: m7b, max_context_tokens: 4096}\n"
        "api: {completion_timeout_s: 30, token_counter: whitespace}\n"
    )
    settings = load_yaml_model(path, ApiAppConfig)
    assert settings.model_map()["m7b"].max_context_tokens == 4096
    assert settings.api.token_counter == "whitespace"
    assert settings.default_slo_class == "interactive"
    path.write_text("models:\n  - {name: m7b, max_context_tokens: -1}\n")
    with pytest.raises(ConfigError, match=r"api.yaml:2: models.0.max_context_tokens"):
        load_yaml_model(path, ApiAppConfig)
