"""Send a scenario's requests to a running QLM at their arrival times, through its public API.

Requests of latency classes (a TTFT target under `stream_below_s`) go as streamed completions
through the official `openai` client, so the client's own first-token time is measured too;
the others go through QLM's asynchronous API (`POST /v1/qlm/requests`, 202 at once), as a
batch client would send them, without holding a stream open per request. Every request asks
for exactly its true output length (`max_tokens` with `ignore_eos`) and carries its SLO class
and its own TTFT target (`slo_ttft_s`, scaled by the speedup), so the plane plans it as the
simulator does. The prompt is text the API's default token counter (utf8-bytes: four ASCII
bytes a token) counts as exactly the scenario's prompt tokens.

Once every request is sent, the queue's records (`GET /v1/qlm/requests/{id}`) give each
request's server-side times: arrival, dispatch, first token, finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import resource
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from qlm.types import Request

REQUESTS_PATH = "/v1/qlm/requests"
QUEUE_PATH = "/v1/qlm/queue"
CONNECT_TIMEOUT_S = 60.0
# An idle connection is closed after this, before the server's own idle timeout closes it
# (uvicorn's default is 5 s; `qlm serve` keeps 75 s): a request sent on a connection the
# server is closing fails as a connection error (seen as hundreds of errors on replays that
# kept a core busy, where the client noticed the server's close late).
CLIENT_KEEPALIVE_S = 2.0
TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(slots=True)
class Sent:
    """What the client saw of one request (monotonic seconds of this process)."""

    request: Request
    server_id: str | None = None
    due_at_s: float | None = None  # when the scenario says to send it
    sent_at_s: float | None = None
    sent_wall_s: float | None = None  # the same moment on the wall clock (the plane's times)
    first_chunk_at_s: float | None = None
    done_at_s: float | None = None
    estimated_wait_s: float | None = None  # x-qlm-estimated-wait-s, server seconds
    estimated_wait_bound_s: float | None = None  # x-qlm-estimated-wait-p90-s
    estimate_basis: str = ""  # x-qlm-estimate-basis (qlm/api/wait_estimate.py)
    error: str | None = None
    record: Mapping[str, Any] = field(default_factory=dict)


def raise_open_files_limit() -> None:
    """Let this process open as many sockets as the system allows (each stream is one; the
    common soft limit of 1,024 files is below a busy scenario's requests in flight). A
    stream the system still refuses fails, and counts as a client error."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_WANTED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # a system that refuses: as it was
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


OPEN_FILES_WANTED = 65536  # when the hard limit is unlimited


def words(seed: str, count: int) -> str:
    """`count` four-byte words ("k3x ") drawn from `seed`: text the utf8-bytes counter counts
    as `count` tokens, different for every seed from its first word."""
    out: list[str] = []
    block = 0
    table = _word_table()
    while len(out) < count:
        digest = hashlib.blake2b(f"{seed}/{block}".encode(), digest_size=32).digest()
        # 16 big-endian two-byte numbers, each one word of the table
        out.extend(table[n % _WORDS] for n in struct.unpack(">16H", digest))
        block += 1
    return "".join(out[:count])


_WORDS = 36**3  # three base-36 digits


@functools.cache
def _word_table() -> tuple[str, ...]:
    """Every word `words` draws from, by number: its three base-36 digits and a space (a
    prompt of 60k tokens is 60k words: converting each number as it is drawn took 15 % of a
    replay client's CPU)."""
    return tuple(_base36(n).rjust(3, "0") + " " for n in range(_WORDS))


@functools.lru_cache(maxsize=4096)
def _block_text(key: int, tokens: int) -> str:
    """A shared prefix block's text (every prompt with the block repeats it)."""
    return words(f"block-{key}", tokens)


def prompt_of(request: Request) -> str:
    """The prompt text of a scenario request: exactly its prompt tokens by the API's default
    counter; its prefix blocks (`Request.prefix`) as text every request with the same block
    key shares, the rest its own. Without distinct text every prompt would share one prefix,
    and engines with a prefix cache would serve the replay faster than the scenario says."""
    parts = [_block_text(block.key, block.tokens) for block in request.prefix]
    own = request.prompt_tokens - sum(block.tokens for block in request.prefix)
    parts.append(words(f"request-{request.id}", max(1 if not parts else 0, own)))
    return "".join(parts)


def describe(exc: BaseException) -> str:
    """The error and what caused it ("APIConnectionError: Connection error. <-
    RemoteProtocolError: Server disconnected ..."): the openai client's own errors say
    nothing of the transport's."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 4:
        parts.append(f"{type(seen).__name__}: {seen}".strip())
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(parts)


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        n, d = divmod(n, 36)
        text = digits[d] + text
        if n == 0:
            return text


def body_of(request: Request, speedup: float) -> dict[str, Any]:
    """The completion body (less stream) for a scenario request at this speedup."""
    body: dict[str, Any] = {
        "model": request.model,
        "prompt": prompt_of(request),
        "max_tokens": request.max_output_tokens,
        "ignore_eos": True,
        "slo_class": request.slo_class,
        "slo_ttft_s": (request.ttft_deadline_at_s - request.arrival_at_s) / speedup,
    }
    if request.completion_deadline_at_s is not None:
        body["deadline_s"] = (request.completion_deadline_at_s - request.arrival_at_s) / speedup
    return body


SUBMITS_AT_ONCE = 64  # asynchronous submissions in flight at once (see Sender.__init__)
STREAM_POOLS = 8  # clients (connection pools) the streams are spread over


class Sender:
    """Sends requests to `url` on the scenario's schedule, `speedup` times faster."""

    def __init__(self, url: str, speedup: float, stream_below_s: float, api_key: str) -> None:
        self.url = url.rstrip("/")
        self.speedup = speedup
        self.stream_below_s = stream_below_s
        # No overall timeout (a batch-class stream may wait its whole target); a minute to
        # connect, so that a busy API's slow accepts delay a request instead of failing it.
        stream_timeout = httpx2.Timeout(None, connect=CONNECT_TIMEOUT_S)
        # No cap on open streams: a stream holds its connection from its send to its last
        # token, so a cap is a queue in the client. With the openai client's default of
        # 1,000, wc-quick (well over 1,000 requests in flight) sent its requests up to 30 s late
        # from its 80th second on, at any speedup (the number in flight does not scale).
        # (the replay raises the open-files limit first, `raise_open_files_limit`)
        stream_limits = httpx2.Limits(max_connections=None, keepalive_expiry=CLIENT_KEEPALIVE_S)
        # Streams hold their connection for their whole life, and the connection pool
        # matches every request against every connection of the pool on each change: with
        # some 350 streams open in one pool (wc-quick) that scan was a third of the client's
        # CPU. Streams take the pools in turn, each pool scanning its share.
        self._streams = itertools.cycle(
            [
                AsyncOpenAI(
                    base_url=f"{self.url}/v1",
                    api_key=api_key,
                    max_retries=0,
                    timeout=stream_timeout,
                    http_client=DefaultAsyncHttpxClient(
                        timeout=stream_timeout, limits=stream_limits
                    ),
                )
                for _ in range(STREAM_POOLS)
            ]
        )
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        headers = {"authorization": f"Bearer {api_key}"}
        limits = httpx.Limits(
            max_connections=SUBMITS_AT_ONCE,
            max_keepalive_connections=None,
            keepalive_expiry=CLIENT_KEEPALIVE_S,
        )
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=timeout, headers=headers, limits=limits, trust_env=False
        )
        # httpcore matches every waiting request against every connection on each change of
        # its pool: with a burst of thousands queued there (a batch backlog sent at once),
        # that scan took the client's whole core for minutes and the requests reached the
        # API late. Waiting here instead keeps the pool's queue short; an asynchronous
        # submission holds a connection for milliseconds, so the wait is short too (and it
        # counts in the admission lag, which starts at `sent_wall_s`).
        self._submits = asyncio.Semaphore(SUBMITS_AT_ONCE)

    async def close(self) -> None:
        for _ in range(STREAM_POOLS):
            await next(self._streams).close()
        await self._http.aclose()

    async def run(self, requests: Sequence[Request], drain_timeout_s: float) -> list[Sent]:
        """Send every request at its time; then wait (at most `drain_timeout_s` of wall
        time after the last send) until every admitted request has ended, and read records."""
        start_s = time.monotonic()
        first_s = requests[0].arrival_at_s if requests else 0.0
        sent = [Sent(r) for r in requests]
        tasks = [
            asyncio.create_task(
                self._one(s, start_s + (s.request.arrival_at_s - first_s) / self.speedup)
            )
            for s in sent
        ]
        await asyncio.gather(*tasks)
        await self._records(sent, time.monotonic() + drain_timeout_s)
        return sent

    async def _one(self, sent: Sent, at_s: float) -> None:
        sent.due_at_s = at_s
        await asyncio.sleep(max(0.0, at_s - time.monotonic()))
        sent.sent_at_s = time.monotonic()
        sent.sent_wall_s = time.time()
        request = sent.request
        budget_s = request.ttft_deadline_at_s - request.arrival_at_s
        try:
            if budget_s < self.stream_below_s:
                await self._stream(sent)
            else:
                await self._submit(sent)
        except Exception as exc:  # a refused or broken request is an outcome, not a crash
            sent.error = describe(exc)

    async def _stream(self, sent: Sent) -> None:
        body = body_of(sent.request, self.speedup)
        model, prompt, max_tokens = body.pop("model"), body.pop("prompt"), body.pop("max_tokens")
        raw = await next(self._streams).completions.with_raw_response.create(
            model=model, prompt=prompt, max_tokens=max_tokens, stream=True, extra_body=body
        )
        self._note_headers(sent, raw.headers)
        stream = raw.parse()
        async for _chunk in stream:
            if sent.first_chunk_at_s is None:
                sent.first_chunk_at_s = time.monotonic()
        sent.done_at_s = time.monotonic()

    async def _submit(self, sent: Sent) -> None:
        body = {"kind": "completion", **body_of(sent.request, self.speedup)}
        async with self._submits:
            response = await self._http.post(REQUESTS_PATH, json=body)
        if response.status_code != 202:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
        self._note_headers(sent, response.headers)

    @staticmethod
    def _note_headers(sent: Sent, headers: Mapping[str, str]) -> None:
        sent.server_id = headers.get("x-qlm-request-id")
        wait = headers.get("x-qlm-estimated-wait-s")
        sent.estimated_wait_s = None if wait is None else float(wait)
        bound = headers.get("x-qlm-estimated-wait-p90-s")
        sent.estimated_wait_bound_s = None if bound is None else float(bound)
        sent.estimate_basis = headers.get("x-qlm-estimate-basis", "")

    async def _records(self, sent: Sequence[Sent], until_s: float) -> None:
        """Wait until the queue holds nothing unended (or time is up), then read each
        admitted request's record."""
        while time.monotonic() < until_s:
            counts = (await self._http.get(QUEUE_PATH)).json()["counts"]
            if not any(n for state, n in counts.items() if state not in TERMINAL):
                break
            await asyncio.sleep(0.5)
        gate = asyncio.Semaphore(32)

        async def read(s: Sent) -> None:
            async with gate:
                response = await self._http.get(f"{REQUESTS_PATH}/{s.server_id}")
            if response.status_code == 200:
                s.record = response.json()

        await asyncio.gather(*(read(s) for s in sent if s.server_id is not None))
