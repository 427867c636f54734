"""Cache diagnostics: for every request, whether the cache served what it could, and if not why.

The files and what each does: server/cache_diag/README.md.
"""

from server.cache_diag.diagnose import diagnose
from server.cache_diag.diagnosis import REASON_TYPES, CacheState, Diagnosis, Prompt
from server.cache_diag.fingerprint import Fingerprint, fingerprint
from server.cache_diag.reporter import CacheReport, CacheReporter, PrefillRate

__all__ = [
    "REASON_TYPES",
    "CacheReport",
    "CacheReporter",
    "CacheState",
    "Diagnosis",
    "Fingerprint",
    "PrefillRate",
    "Prompt",
    "diagnose",
    "fingerprint",
]
