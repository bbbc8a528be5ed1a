"""Writing and running programs from Python: `ProgramBuilder` makes the body of
`POST /v1/qlm/programs` (each `input` and `call` returns the `{{name}}` that uses it), and
`ProgramClient` submits it and reads variables. A map-reduce summary:

    p = ProgramBuilder("mistral-7b", deadline_s=30)
    parts = [p.call(f"s{i}", "Summarise: " + p.input(f"c{i}", c)) for i, c in enumerate(chunks)]
    p.call("summary", "Merge these summaries: " + " ".join(parts))
    with ProgramClient("http://127.0.0.1:8000") as client:
        program_id = client.submit(p)
        print(client.value(program_id, "summary", wait_s=60))
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

PROGRAMS = "/v1/qlm/programs"


class ProgramBuilder:
    def __init__(
        self,
        model: str,
        *,
        max_tokens: int | None = None,
        slo_class: str | None = None,
        deadline_s: float | None = None,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.slo_class = slo_class
        self.deadline_s = deadline_s
        self.inputs: dict[str, str] = {}
        self.calls: list[dict[str, Any]] = []

    def input(self, name: str, text: str) -> str:
        """A value the client gives; returns its placeholder."""
        self.inputs[name] = text
        return "{{" + name + "}}"

    def call(
        self,
        name: str,
        prompt: str,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        **sampling: Any,
    ) -> str:
        """A call whose output is the variable `name`; returns its placeholder."""
        call: dict[str, Any] = {"name": name, "model": model or self.model, "prompt": prompt}
        if (max_tokens or self.max_tokens) is not None:
            call["max_tokens"] = max_tokens or self.max_tokens
        if sampling:
            call["sampling"] = sampling
        self.calls.append(call)
        return "{{" + name + "}}"

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"calls": self.calls, "inputs": self.inputs}
        if self.deadline_s is not None:
            body["deadline_s"] = self.deadline_s
        if self.slo_class is not None:
            body["slo_class"] = self.slo_class
        return body


class ProgramError(RuntimeError):
    """The server refused the program or a read (its message names the field)."""


class ProgramClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 330) -> None:
        headers = {} if api_key is None else {"authorization": f"Bearer {api_key}"}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> ProgramClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._http.close()

    def submit(self, program: ProgramBuilder) -> str:
        """The new program's id."""
        return str(self._json(self._http.post(PROGRAMS, json=program.body()))["id"])

    def get(self, program_id: str) -> dict[str, Any]:
        return self._json(self._http.get(f"{PROGRAMS}/{program_id}"))

    def value(self, program_id: str, name: str, wait_s: float = 0.0) -> str | None:
        """A variable's value, waiting up to `wait_s` for it; None if it is not known by
        then; ProgramError if its call failed."""
        url = f"{PROGRAMS}/{program_id}/variables/{name}"
        view = self._json(self._http.get(url, params={"wait_s": wait_s}))
        if view["state"] == "failed":
            raise ProgramError(f"{name}: {view['error']}")
        value = view["value"]
        return None if value is None else str(value)

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        if response.status_code >= 400:
            raise ProgramError(f"HTTP {response.status_code}: {response.text}")
        data: dict[str, Any] = response.json()
        return data
