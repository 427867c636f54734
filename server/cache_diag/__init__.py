"""Cache diagnostics: for every request, whether the cache served what it could, and if not why.

fingerprint.py  hashes and boundaries of a prompt (no text)
changes.py      structural differences between two requests (system, tools, messages)
diagnose.py     one reason type per miss, the tokens it cost, where the prompts diverged
fixes.py        the one-line reason and fix of each type
store.py        baselines: each session's previous prompt, fingerprints by response id
reporter.py     the service's entry point (baseline lookup, prefill-rate EWMA, report fields)
"""

from server.cache_diag.diagnose import REASON_TYPES, CacheState, Diagnosis, Prompt, diagnose
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
