"""One frozen Settings object: defaults < config YAML < environment (AGENTSERVE_*) < CLI flags.

Every field is documented in this package, one module per section (``settings.py`` holds the top
level); ``configs/*.yaml`` set them per deployment. Nested
fields are set from the environment with a double underscore, e.g.
``AGENTSERVE_PREFIX_CACHE__MEMORY_MB=2048``.
"""

from server.config.auth import AuthSettings
from server.config.cache import PrefixCacheSettings, Tier2Settings
from server.config.cache_policy import CacheSettings
from server.config.engine import EngineSettings, VllmSettings
from server.config.limits import LimitsSettings
from server.config.responses import ResponsesSettings, WebSocketSettings
from server.config.router import RoutingSettings
from server.config.settings import ConfigError, Settings, load_settings

__all__ = [
    "AuthSettings",
    "CacheSettings",
    "ConfigError",
    "EngineSettings",
    "LimitsSettings",
    "PrefixCacheSettings",
    "ResponsesSettings",
    "RoutingSettings",
    "Settings",
    "Tier2Settings",
    "VllmSettings",
    "WebSocketSettings",
    "load_settings",
]
