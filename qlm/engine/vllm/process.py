"""The vLLM server process of one engine over its life: launch, health, watch, stop.

Question answered: how is a server process started, known to be serving, noticed when it dies,
and stopped with everything it spawned? A server runs in its own session (its pid is its
process group: API server, engine core, workers), on a free local port, its output in a log
file. Linux signals it when its agent dies, even by SIGKILL (PR_SET_PDEATHSIG), and the
reaper at its head (reaper.py) takes the whole group down. Stopping is SIGTERM to the group,
a grace period, then SIGKILL. `Supervisor` holds the engine's current
server: a model load parks it and starts another (`park`, `start`); an exit nobody asked for
is reported to `on_exit` with the tail of the server's log. With `standby_models`, a parked
server keeps running idle (the standby tier, qlm/engine/model/tiers.py: the least recently served
one beyond the capacity stops), and `start` of its model switches back to it after a health
check instead of launching a process. `fetch` fills a place of the tier while the engine
serves: a server of another model starts in the background and parks once healthy (a later
`start` of that model waits for it rather than launching a second one).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import math
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import aiohttp

from qlm.config.vllm_config import VllmEngineConfig, serve_argv
from qlm.engine.engine_types import EngineError
from qlm.engine.model.tiers import StandbyTier

log = logging.getLogger("qlm.engine.vllm")
HEALTH_POLL_S = 0.25
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5.0)  # /health requests
SLEEP_TIMEOUT = aiohttp.ClientTimeout(total=120.0)  # /sleep and /wake_up move the weights
# A server busy streaming can take seconds to answer /metrics; a slow scrape still beats none
# (a scrape cut at 5 s under load left the engine's KV reading stale for minutes).
METRICS_TIMEOUT = aiohttp.ClientTimeout(total=30.0)
GROUP_EXIT_POLL_S = 0.1
STRAY_GRACE_S = 5.0  # SIGTERM grace for the engine core and workers of a server that died
LOG_TAIL_BYTES = 4096
REAPER = Path(__file__).with_name("reaper.py")


@dataclass(slots=True)
class ServerProcess:
    """One launched server."""

    proc: asyncio.subprocess.Process
    model: str
    port: int
    host: str
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class Supervisor:
    """The current server of one engine (`server`; None when stopped)."""

    def __init__(self, config: VllmEngineConfig, name: str, on_exit: Callable[[str], None]) -> None:
        self.config = config
        self.server: ServerProcess | None = None
        self.standby: dict[str, ServerProcess] = {}  # parked servers, running idle
        self._tier = StandbyTier(config.standby_models)
        self._name = name  # in log file names
        self._on_exit = on_exit
        self._launches = 0
        self._log_dir = config.log_dir
        self._watchers: set[asyncio.Task[None]] = set()
        self._fetches: dict[str, asyncio.Task[None]] = {}  # model -> its server starting

    async def start(
        self, model: str, http: aiohttp.ClientSession, *, park: bool = False
    ) -> ServerProcess:
        """Serve `model`: its standby server if one runs, else a new server (`park`: the
        current one parks first, once `model` has left the tier, so a full tier keeps
        `model`'s server); wait until /health answers. EngineError when it exits first or
        is not healthy within the startup timeout."""
        fetch = self._fetches.get(model)
        if fetch is not None:  # its server is on its way: sooner than a new one
            await asyncio.wait({fetch})
        parked = self.standby.pop(model, None)
        self._tier.wake(model)
        if park and self.server is not None and self.server.model == model:
            parked, self.server = self.server, None  # parks and serves again at once
        elif park:
            await self.park(http)
        if parked is not None and (woken := await self._resume(parked, http)) is not None:
            return woken
        server = await self._launch(model)
        await self._wait_healthy(server, http)
        return server

    async def _resume(
        self, server: ServerProcess, http: aiohttp.ClientSession
    ) -> ServerProcess | None:
        self.server = server
        try:
            if self.config.sleep_mode:
                await self._post(server, http, "/wake_up")
            await self._wait_healthy(server, http)
        except EngineError:  # it died or hangs while parked: start afresh
            self.server = None
            await terminate(server.proc, self.config.stop_timeout_s)
            return None
        return server

    async def park(self, http: aiohttp.ClientSession) -> None:
        """Stop serving the current server: it joins the standby tier (asleep with
        `sleep_mode`), or stops when the tier has no room (the least recently served standby
        server stops instead) or it does not fall asleep."""
        server, self.server = self.server, None
        if server is None:
            return
        if self._tier.capacity == 0 or not await self._asleep(server, http):
            await terminate(server.proc, self.config.stop_timeout_s)
            return
        self._tier.sleep(server.model)
        self.standby[server.model] = server
        await self._trim()

    async def _trim(self) -> None:
        """Stop the servers of models the tier no longer holds (asleep or being fetched)."""
        called_off = [self._fetches.pop(m) for m in list(self._fetches)
                      if m not in self._tier.fetching]  # fmt: skip
        for task in called_off:
            task.cancel()  # the task stops the server it started
        await asyncio.gather(*called_off, return_exceptions=True)
        for model in [m for m in self.standby if m not in self._tier.models]:
            await terminate(self.standby.pop(model).proc, self.config.stop_timeout_s)

    def fetching_models(self) -> tuple[str, ...]:
        return tuple(self._fetches)

    def fetch(self, model: str, http: aiohttp.ClientSession, replacing: str | None = None) -> bool:
        """Start a server of `model` in the background, to park once healthy, in a free
        place of the tier or in `replacing`'s (whose standby server stops). False, changing
        nothing, when it serves, sleeps or is fetched already, or no place is free."""
        serving = self.server is not None and self.server.model == model
        if serving or not self._tier.fetch(model, math.inf, replacing):
            return False
        loop = asyncio.get_running_loop()
        self._fetches[model] = loop.create_task(self._fetch(model, http), name=f"fetch-{model}")
        return True

    async def _fetch(self, model: str, http: aiohttp.ClientSession) -> None:
        await self._trim()  # a replaced model's server
        server = None
        try:
            server = await self._spawn(model)
            await self._wait_healthy(server, http)
            asleep = await self._asleep(server, http)  # still a fetch meanwhile: start waits
        except (EngineError, OSError) as exc:
            log.warning("standby server of %s did not start: %s", model, exc)
            asleep = False
        except asyncio.CancelledError:
            await self._fetch_ended(model, server)
            raise
        if server is not None and asleep and self._tier.fetched(model):
            self._fetches.pop(model, None)
            self.standby[model] = server
        else:  # it failed, or a model the engine left took its place meanwhile
            await self._fetch_ended(model, server)

    async def _asleep(self, server: ServerProcess, http: aiohttp.ClientSession) -> bool:
        """Whether the server can wait in the tier: it runs, and with `sleep_mode` it fell
        asleep (level 1) when asked."""
        if server.proc.returncode is not None:
            return False
        if not self.config.sleep_mode:
            return True
        try:
            await self._post(server, http, "/sleep?level=1")
        except EngineError as exc:
            log.warning("%s server did not fall asleep: %s", server.model, exc)
            return False
        return True

    async def _post(self, server: ServerProcess, http: aiohttp.ClientSession, path: str) -> None:
        """POST to the server (vLLM's sleep-mode routes answer 200 once done)."""
        try:
            async with http.post(f"{server.base_url}{path}", timeout=SLEEP_TIMEOUT) as r:
                if r.status != HTTPStatus.OK:
                    raise EngineError(f"POST {path}: HTTP {r.status}: {(await r.text())[:200]}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise EngineError(f"POST {path}: {exc!r}") from exc

    async def _fetch_ended(self, model: str, server: ServerProcess | None) -> None:
        self._fetches.pop(model, None)
        self._tier.drop_fetch(model)
        if server is not None:
            await terminate(server.proc, self.config.stop_timeout_s)

    def standby_models(self) -> tuple[str, ...]:
        """The models whose servers run idle, most recently served first."""
        return tuple(
            m
            for m in self._tier.models
            if m in self.standby and self.standby[m].proc.returncode is None
        )

    async def stop(self) -> None:
        """Stop the current server (if any) and everything it spawned."""
        server, self.server = self.server, None
        if server is not None:
            await terminate(server.proc, self.config.stop_timeout_s)

    async def stop_standby(self) -> None:
        """Stop every standby server and fetch (the tier empties)."""
        for model in list(self._fetches):
            self._tier.drop_fetch(model)
        await self._trim()
        for model in list(self.standby):
            self._tier.wake(model)
            await terminate(self.standby.pop(model).proc, self.config.stop_timeout_s)

    async def close(self) -> None:
        """Stop watching (after stop)."""
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    async def _launch(self, model: str) -> ServerProcess:
        """Start a server of `model` to serve (the current one)."""
        server = await self._spawn(model)
        self.server = server
        return server

    async def _spawn(self, model: str) -> ServerProcess:
        port = self.config.port or await free_port(self.config.host)
        self._launches += 1
        log_path = self._next_log_path(model)
        env = {**os.environ, **self.config.server_env()}
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *reaped(serve_argv(self.config, model, port), self._reaper_grace_s),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(
                    _in_child, os.getpid(), self.config.cpu_cores, self.config.cpu_nice
                ),
            )
        server = ServerProcess(proc, model, port, self.config.host, log_path)
        task = asyncio.get_running_loop().create_task(self._watch(server), name=f"watch-{proc.pid}")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        return server

    @property
    def _reaper_grace_s(self) -> float:
        """The reaper's SIGTERM grace: short, so a crash is reported within seconds (a stop
        ends sooner still when the group exits on SIGTERM)."""
        return min(STRAY_GRACE_S, self.config.stop_timeout_s)

    def _next_log_path(self, model: str) -> Path:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="qlm-vllm-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir / f"{self._name}-{self._launches}-{model}.log"

    async def _wait_healthy(self, server: ServerProcess, http: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout_s
        while True:
            if server.proc.returncode is not None:
                raise EngineError(
                    f"vllm server exited with code {server.proc.returncode} while starting: "
                    f"{log_tail(server.log_path)}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(f"{server.base_url}/health", timeout=PROBE_TIMEOUT) as r:
                    if r.status == HTTPStatus.OK:
                        return
            if loop.time() > deadline:
                raise EngineError(
                    f"vllm server not healthy after {self.config.startup_timeout_s} s "
                    f"(log: {server.log_path})"
                )
            await asyncio.sleep(HEALTH_POLL_S)

    async def _watch(self, server: ServerProcess) -> None:
        """Report an exit nobody asked for, then clear up what the server left."""
        code = await server.proc.wait()
        if self.server is not server:
            return  # stopped on purpose
        self.server = None
        self._on_exit(f"vllm server exited with code {code}: {log_tail(server.log_path)}")
        await terminate(server.proc, min(STRAY_GRACE_S, self.config.stop_timeout_s))


async def free_port(host: str) -> int:
    """A port nobody listens on now (asked of the OS by binding port 0)."""

    def _close(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(_close, host, 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port


def reaped(argv: list[str], grace_s: float) -> list[str]:
    """`argv` run under reaper.py, which takes its process group down when the agent dies or
    the server exits (SIGTERM, `grace_s`, SIGKILL): vLLM's own shutdown can hang."""
    return [sys.executable, str(REAPER), f"{grace_s:g}", *argv]


def _in_child(parent_pid: int, cpu_cores: tuple[int, ...] | None, nice: int = 0) -> None:
    """Between fork and exec: die with the agent, keep to the configured cores and take the
    configured niceness (both inherited by everything the server starts)."""
    _die_with_parent(parent_pid)
    if cpu_cores is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpu_cores)
    if nice:
        os.nice(nice)


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the server's process between fork and exec: Linux sends it SIGTERM when the
    agent that started it dies, even by SIGKILL, so a server never outlives its agent (it
    would hold its GPU memory, and a restarted agent would start a second one). The process
    is the reaper (reaper.py), which takes the server's whole group down. No-op elsewhere."""
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the agent died before prctl took effect
        os._exit(1)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def terminate(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the server's process group (API server, engine core, workers), wait, SIGKILL
    what is left. The server is a session leader, so its pid is the group id."""
    loop = asyncio.get_running_loop()
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    try:
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            _signal_group(pgid, signal.SIGKILL)
            await proc.wait()
        deadline = loop.time() + grace_s
        while _group_alive(pgid) and loop.time() < deadline:
            await asyncio.sleep(GROUP_EXIT_POLL_S)
    finally:  # also when cancelled: nothing of the server may outlive this
        _signal_group(pgid, signal.SIGKILL)


def log_tail(path: Path, max_lines: int = 6) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-max_lines:])
