"""A program's calls as a graph (after Parrot's semantic variables): each call's prompt is a
template whose `{{name}}` placeholders are the program's inputs or other calls' outputs; a
call's output is the variable named after it. Pure: validation, order and rendering.

Question answered: is this program well formed, and in which order can its calls run?
`ProgramGraph.of(spec, limits)` refuses a malformed program with a `ProgramError` naming the
call and the variable (an unknown variable, a cycle, a name given twice, more calls or more
references than the limits allow); `ready(done)` lists the calls whose inputs all exist;
`render` fills a template.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_\-]*)\s*\}\}")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")


class ProgramError(ValueError):
    """A malformed program; `param` names the offending field (`calls[2].prompt`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class ProgramCall:
    """One call: its name (also its output variable), model, prompt template, output cap and
    the sampling fields passed to the engine as a completion's would be."""

    name: str
    model: str
    prompt: str
    max_tokens: int
    sampling: Mapping[str, object] = field(default_factory=dict)

    @property
    def references(self) -> tuple[str, ...]:
        """The variables its prompt uses, each once, in order of first use."""
        return tuple(dict.fromkeys(VARIABLE.findall(self.prompt)))

    @property
    def head(self) -> str:
        """The prompt up to its first variable: the part every run of the template shares."""
        found = VARIABLE.search(self.prompt)
        return self.prompt if found is None else self.prompt[: found.start()]


@dataclass(frozen=True, slots=True)
class ProgramLimits:
    max_calls: int = 256
    max_references: int = 64  # variables one prompt may use (a merge's fan-in)
    max_consumers: int = 256  # calls one variable may feed (fan-out)


@dataclass(frozen=True, slots=True)
class ProgramGraph:
    """A validated program: calls in a topological order (each after the calls it uses)."""

    calls: tuple[ProgramCall, ...]
    inputs: frozenset[str]
    consumers: Mapping[str, tuple[str, ...]]  # variable -> the calls that use it

    @classmethod
    def of(
        cls,
        calls: tuple[ProgramCall, ...],
        inputs: Collection[str],
        limits: ProgramLimits | None = None,
    ) -> ProgramGraph:
        limits = limits or ProgramLimits()
        _check_names(calls, inputs, limits)
        known = {c.name for c in calls} | set(inputs)
        consumers: dict[str, list[str]] = {}
        for i, call in enumerate(calls):
            refs = call.references
            if len(refs) > limits.max_references:
                raise ProgramError(
                    f"call '{call.name}' uses {len(refs)} variables; at most "
                    f"{limits.max_references} per prompt",
                    f"calls[{i}].prompt",
                )
            for ref in refs:
                if ref not in known:
                    raise ProgramError(
                        f"call '{call.name}' uses variable '{ref}', which is neither an input "
                        "nor a call's output",
                        f"calls[{i}].prompt",
                    )
                consumers.setdefault(ref, []).append(call.name)
        unused = next((name for name in inputs if name not in consumers), None)
        if unused is not None:
            raise ProgramError(f"input '{unused}' is used by no call", "inputs")
        for variable, users in consumers.items():
            if len(users) > limits.max_consumers:
                raise ProgramError(
                    f"variable '{variable}' feeds {len(users)} calls; at most "
                    f"{limits.max_consumers}",
                    "calls",
                )
        ordered = _topological(calls)
        fixed = {k: tuple(v) for k, v in consumers.items()}
        return cls(ordered, frozenset(inputs), MappingProxyType(fixed))

    def call(self, name: str) -> ProgramCall:
        return next(c for c in self.calls if c.name == name)

    def ready(self, done: Collection[str]) -> tuple[ProgramCall, ...]:
        """The calls not in `done` whose every call input is in `done` (inputs always are)."""
        return tuple(
            c
            for c in self.calls
            if c.name not in done and all(r in done or r in self.inputs for r in c.references)
        )

    def sinks(self) -> tuple[str, ...]:
        """The calls whose output no other call uses: the program's results."""
        return tuple(c.name for c in self.calls if c.name not in self.consumers)


def render(template: str, values: Mapping[str, str]) -> str:
    """The template with each `{{name}}` replaced by its value (all must be given)."""
    return VARIABLE.sub(lambda m: values[m.group(1)], template)


def _check_names(
    calls: tuple[ProgramCall, ...], inputs: Collection[str], limits: ProgramLimits
) -> None:
    if len(calls) > limits.max_calls:
        raise ProgramError(
            f"{len(calls)} calls; a program may have at most {limits.max_calls}", "calls"
        )
    for name in inputs:
        if not NAME.fullmatch(name):
            raise ProgramError(f"input name '{name}' is not a valid variable name", "inputs")
    seen = set(inputs)
    for i, call in enumerate(calls):
        if not NAME.fullmatch(call.name):
            raise ProgramError(
                f"call name '{call.name}' is not a valid variable name (letters, digits, _ "
                "and -, starting with a letter or _)",
                f"calls[{i}].name",
            )
        if call.name in seen:
            raise ProgramError(
                f"'{call.name}' names two variables (a call's output and another call or input)",
                f"calls[{i}].name",
            )
        seen.add(call.name)


def _topological(calls: tuple[ProgramCall, ...]) -> tuple[ProgramCall, ...]:
    """The calls each after those whose output it uses (stable: submission order where
    free); a cycle is a ProgramError naming it. Iterative: a chain may be long."""
    by_name = {c.name: c for c in calls}
    uses = {c.name: [r for r in c.references if r in by_name] for c in calls}
    state: dict[str, int] = {}  # 1: on the current path, 2: placed
    order: list[ProgramCall] = []
    for root in by_name:
        if root in state:
            continue
        state[root], path, stack = 1, [root], [(root, 0)]
        while stack:
            name, i = stack[-1]
            if i == len(uses[name]):
                stack.pop()
                path.pop()
                state[name] = 2
                order.append(by_name[name])
                continue
            stack[-1] = (name, i + 1)
            ref = uses[name][i]
            if state.get(ref) == 1:
                cycle = [*path[path.index(ref) :], ref]
                index = list(by_name).index(ref)
                raise ProgramError(
                    f"calls {' -> '.join(cycle)} form a cycle", f"calls[{index}].prompt"
                )
            if ref not in state:
                state[ref] = 1
                path.append(ref)
                stack.append((ref, 0))
    return tuple(order)
