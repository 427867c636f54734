"""The Settings object and load_settings: defaults < config YAML < environment (AGENTSERVE_*) < CLI flags."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from server.config.auth import AuthSettings
from server.config.cache import PrefixCacheSettings
from server.config.cache_policy import CacheSettings
from server.config.engine import EngineSettings, VllmSettings
from server.config.limits import LimitsSettings
from server.config.responses import ResponsesSettings, WebSocketSettings
from server.config.router import RoutingSettings
from server.package_data import CONFIGS_DIR

_CONFIG_FILE: ContextVar[Path | None] = ContextVar("agentserve_config_file", default=None)


class ConfigError(ValueError):
    """Settings that cannot work; the message names the field, the value and the fix."""


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
    default_logit_bias: dict[str, float] | None = Field(
        None,
        description="logit_bias for a request that sends none (every API), keyed by token text, one token of "
        "the model's vocabulary each (e.g. {'<|im_end|>': 10}; ids resolved at start). Unset: the model's "
        "own default (configs/models/NAME.yaml: the embedded model raises <|im_end|> by 10 so its replies "
        "end); {}: none. A request's own logit_bias ({} included) replaces it.",
    )
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
    prefill_dtype: Literal["auto", "bfloat16"] = Field(
        "auto",
        description="hf engine, float32 model: auto = prefill in the model's dtype; bfloat16 = prefill "
        "chunks' linears and attention in bfloat16 (~2x faster on a CPU with AMX or AVX512-BF16, logits "
        "~0.2 apart; +half the linears' bytes for a bfloat16 copy), decode stays float32.",
    )
    prefix_cache: PrefixCacheSettings = PrefixCacheSettings()
    cache: CacheSettings = CacheSettings()
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
        "auto = detected from the model folder at start (none matches: template); template = the model's "
        "own chat template (tool calls masked only with an envelope set here, else not at all). The "
        "family names its tool-call envelope.",
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

    def max_retention_s(self) -> float:
        """The longest a client's retention hint holds (``limits.max_retention_s``, else the session
        policy's cap ``prefix_cache.session_cap_s``)."""
        cap = self.limits.max_retention_s
        return cap if cap is not None else self.prefix_cache.session_cap_s

    def tenant_share(self) -> float:
        """One tenant's most share of the process's requests and sockets (``limits.tenant_share``)."""
        share = self.limits.tenant_share
        if share is not None:
            return share
        shared = len(self.auth.api_keys) >= 2 or self.auth.require_router
        return 0.5 if shared else 1.0

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


def config_path(config_file: str | Path) -> Path:
    """A YAML file, or the name of a config shipped in the package (``vllm``, ``embedded``)."""
    text = str(config_file)
    if Path(text).is_file():
        return Path(text)
    if "/" not in text and not text.endswith((".yaml", ".yml")):
        shipped = CONFIGS_DIR / f"{text}.yaml"
        if shipped.is_file():
            return shipped
        names = sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
        raise ConfigError(f"no config named {text!r}: pass a YAML file to --config, or one of {names}")
    raise ConfigError(f"config file {text} does not exist: pass an existing YAML file to --config")


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from a YAML file, the environment and explicit overrides (None = unset)."""
    path = config_path(config_file) if config_file else None
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
