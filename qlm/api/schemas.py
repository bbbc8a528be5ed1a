"""Request bodies: OpenAI's completions and chat bodies plus QLM's SLO fields, and the
asynchronous submission body that carries either under `kind`.

Models are defined once and validated straight from the JSON bytes (strict types, so "5" is
not a number). A field QLM does not honour is refused (400 naming it, `unsupported_parameter`),
never accepted and ignored. Tool calls, structured output, log probabilities and penalties
are honoured by engines that can (qlm/engine/openai_fields.py) and refused for the others, so
a client asking for them never gets plain text as if they had been applied.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, TypeAdapter, model_validator

from qlm.api.slo import SloTags
from qlm.api.tokens import flatten_chat
from qlm.config import StrictModel
from qlm.engine.openai_fields import OUTPUT_FIELDS

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Body(StrictModel):
    """Unknown fields are refused (StrictModel); types are strict and numbers finite."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _drop_unset(cls, data: Any) -> Any:
        """Unknown fields that ask for nothing (null, false, 0, empty) are dropped: clients
        and replayed histories send `"logprobs": null`, `"refusal": null`, `"tool_calls": []`;
        any other value of an unknown field is refused."""
        if not isinstance(data, dict):
            return data
        known = cls.model_fields
        return {k: v for k, v in data.items() if k in known or not _asks_nothing(v)}


def _asks_nothing(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == [] or value == {}


def _default_output(name: str, value: object) -> bool:
    """Like `_asks_nothing`, except that a zero asks for something (`logprobs: 0`: the
    chosen tokens' log probabilities) unless it is a penalty's default."""
    if value == 0 and value is not False:
        return name.endswith("_penalty")
    return _asks_nothing(value)


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None  # a tool message's link to its call; its content is kept
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls, in a history

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _Common(_Body):
    """Fields shared by both bodies: the model, output cap, streaming, sampling, SLO tags."""

    model: str = Field(min_length=1, max_length=512)
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only one choice per request.")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)  # what engines accept
    # vLLM's extension: generate max_tokens even past end-of-sequence (exact lengths for
    # benchmarks); honoured by the vLLM and emulated engines.
    ignore_eos: bool = False
    user: str | None = Field(default=None, max_length=256)
    # Output fields only some engine kinds honour (qlm/engine/openai_fields.py): the engine
    # receives them as sent; the API refuses them when the fleet's engines cannot.
    response_format: dict[str, Any] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    # QLM's SLO tags (see qlm/api/README.md).
    slo_class: str | None = Field(default=None, min_length=1, max_length=128)
    slo_ttft_s: float | None = Field(default=None, gt=0)
    deadline_s: float | None = Field(default=None, gt=0)

    def sampling(self) -> dict[str, object]:
        """The sampling fields the client set, for the engine."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "stop": self.stop}
        given["seed"] = self.seed
        given["ignore_eos"] = self.ignore_eos or None
        return {k: v for k, v in given.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def output_cap(self) -> int | None:
        return self.max_tokens

    def cap_param(self) -> str:
        return "max_tokens"

    def tags(self) -> SloTags:
        return SloTags(self.slo_class, self.slo_ttft_s, self.deadline_s)

    def output_fields(self) -> dict[str, object]:
        """The output fields the client set; a value that asks for nothing (null, false, an
        empty list or object, a zero penalty) is not set."""
        fields = self.model_dump(include=set(OUTPUT_FIELDS), exclude_none=True)
        return {k: v for k, v in fields.items() if not _default_output(k, v)}

    def engine_messages(self) -> list[dict[str, Any]] | None:
        """The chat messages as sent, for engines that apply the model's template."""
        return None


class CompletionBody(_Common):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    logprobs: int | None = Field(default=None, ge=0, le=20)

    prompt_param: ClassVar[str] = "prompt"

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    prompt_param: ClassVar[str] = "messages"

    def output_cap(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def cap_param(self) -> str:
        return "max_tokens" if self.max_completion_tokens is None else "max_completion_tokens"

    def prompt_text(self) -> str:
        return flatten_chat((m.role, m.text()) for m in self.messages)

    def engine_messages(self) -> list[dict[str, Any]] | None:
        return [m.model_dump(exclude_none=True) for m in self.messages]


class ChatSubmission(ChatBody):
    kind: Literal["chat"]


class CompletionSubmission(CompletionBody):
    kind: Literal["completion"]


Body = ChatBody | CompletionBody
Submission = Annotated[ChatSubmission | CompletionSubmission, Field(discriminator="kind")]
SUBMISSION: TypeAdapter[ChatSubmission | CompletionSubmission] = TypeAdapter(Submission)
SUBMISSION_KINDS = ("chat", "completion")
