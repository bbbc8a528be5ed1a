"""What a request's settings become in the native runner.

Question answered: which of Request.sampling does the native engine honour, and how? temperature
(below 1e-5 greedy), top_p, seed, ignore_eos as the runner's `Sampling`; stop strings (the
output is cut before the first one) kept by the engine. Bad values are an EngineError naming
the request.
"""

from __future__ import annotations

from qlm.engine.engine_types import EngineError
from qlm.engine.native.paged_sequence import Sampling
from qlm.types import Request


def temperature_of(value: object) -> float:
    """The request's temperature; below 1e-5 it is greedy (0): dividing logits by less
    overflows them."""
    temperature = 1.0 if value is None else float(str(value))
    return 0.0 if 0 <= temperature < 1e-5 else temperature


def sampling_of(request: Request, max_tokens: int) -> Sampling:
    s = request.sampling
    temperature = s.get("temperature")
    top_p = s.get("top_p")
    seed = s.get("seed")
    try:
        return Sampling(
            max_tokens=max_tokens,
            temperature=temperature_of(temperature),
            top_p=1.0 if top_p is None else float(str(top_p)),
            seed=None if seed is None else int(str(seed)),
            ignore_eos=request.ignores_eos,
        )
    except ValueError as exc:
        raise EngineError(f"request {request.id}: {exc}") from exc


def stops_of(request: Request) -> tuple[str, ...]:
    stop = request.sampling.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list):
        return tuple(str(s) for s in stop)
    raise EngineError(f"request {request.id}: stop must be a string or a list of strings")
