"""The llamacpp engine's prefix cache: llama.cpp sequence ids as slots that keep their KV.

A slot is one sequence id of the context. A running request owns one; when it ends its slot
keeps the KV of the tokens it holds (prompt + reply) and becomes *idle*: a later prompt that
starts with those tokens (the session's next turn, another session's same system prompt)
takes the longest match from any slot, running or idle, of the same namespace (cache salt),
and gets it by ``seq_cp`` into a free slot. The KV pool is unified, so that copy shares the
cells: eight sessions with one system prompt hold it once. An idle slot whose whole content
a new prompt extends is taken by it (the new request's slot holds it all), and so is an idle slot
whose whole *prompt* the new one holds: what it held beyond was its own reply,
which the session's next turn sends back in the client's rendering (a dead branch kept would hold
cells that every later decode attends over: llama.cpp attends up to the highest cell in use).
When slots or cells run out an
idle slot goes: the one ``victim`` picks (retention.py; least recently used by default).
Token-granular: ``cached_tokens`` is any count.

Pure Python (no llama_cpp here): the engine applies the plan with the runtime's
``seq_copy`` / ``seq_trim``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (slices compared in C: a 5k-token prompt
    against every slot and saved state on each admission, a Python loop took ~0.3 ms each).
    Both lists or both tuples: a list slice never equals a tuple slice."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Slot:
    seq: int  # the llama.cpp sequence id
    tokens: list[int] = field(default_factory=list)  # the tokens whose KV the slot holds, in order
    salt: str = ""
    session: str = ""
    busy: bool = False
    used: int = 0  # a logical clock: larger = used more recently
    prompt_len: int = 0  # of ``tokens``, how many were the prompt (the rest: the reply)


def least_recently_used(idle: list[Slot]) -> Slot:
    return min(idle, key=lambda s: s.used)


def superseded(slot: Slot, prompt: list[int]) -> bool:
    """A new ``prompt`` starts with all of idle ``slot``'s prompt: the slot's only other KV is the reply
    it wrote, which this turn replaces (the same prompt again, or the conversation's next turn; by
    content, as the slot-extends rule: ``/v1/completions`` has no session beyond its prompt)."""
    n = slot.prompt_len
    return n > 0 and len(prompt) >= n and common_length(slot.tokens[:n], prompt) == n


@dataclass(frozen=True)
class Evicted:
    """What an idle slot held when it was taken from it: the engine saves it (tier 2), then clears it."""

    seq: int
    salt: str
    tokens: list[int]


@dataclass(frozen=True)
class Claim:
    """Where a new request's KV starts: its slot, and ``cached`` tokens copied from ``source``."""

    slot: Slot
    source: Slot | None
    cached: int
    dropped: tuple[Evicted, ...] = ()  # idle slots whose KV the engine must clear (seq_trim 0)


class SlotTable:
    def __init__(self, n_seq: int, victim: Callable[[list[Slot]], Slot] = least_recently_used) -> None:
        """``victim``: which idle slot goes when one must (retention.py: the session policy)."""
        self.slots = [Slot(i) for i in range(n_seq)]
        self.victim = victim
        self._clock = 0

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def best_match(self, prompt: list[int], salt: str) -> tuple[Slot | None, int]:
        """The slot sharing the longest prefix with ``prompt`` (at most ``len(prompt) - 1`` tokens)."""
        best, n_best = None, 0
        limit = len(prompt) - 1  # the last prompt token is always computed: its logits are needed
        for s in self.slots:
            if s.salt != salt or not s.tokens:
                continue
            n = min(common_length(s.tokens, prompt), limit)
            if n > n_best or (n == n_best and n > 0 and best is not None and not s.busy and best.busy):
                best, n_best = s, n
        return best, n_best

    def claim(self, prompt: list[int], salt: str, session: str) -> Claim | None:
        """A slot for a new request and its cached prefix; None while every slot is busy."""
        source, n = self.best_match(prompt, salt)
        dropped: list[Evicted] = []
        free = [s for s in self.slots if not s.busy and not s.tokens]
        if source is not None and not source.busy and (n == len(source.tokens) or superseded(source, prompt)):
            # the new prompt extends everything the idle slot holds, or all but the reply it wrote
            # (the session's next turn): take that slot itself, trimmed to the shared prefix
            slot = source
            source = None
        elif free:
            slot = free[0]
        else:
            idle = [s for s in self.slots if not s.busy and s is not source]
            if not idle:
                return None
            slot = self.victim(idle)
            if slot.tokens:
                dropped.append(Evicted(slot.seq, slot.salt, slot.tokens))
        slot.busy = True
        slot.salt = salt
        slot.session = session
        slot.used = self._tick()
        if source is not None:
            source.used = slot.used
        slot.tokens = list(prompt[:n])  # the engine trims / copies the slot's KV to exactly these
        return Claim(slot, source, n, tuple(dropped))

    def release(self, slot: Slot, tokens: list[int], prompt_len: int | None = None) -> None:
        """A request ended: its slot keeps the KV of ``tokens`` (an empty list: keeps nothing), of
        which ``prompt_len`` were the prompt (None: all of them)."""
        slot.busy = False
        slot.tokens = list(tokens)
        slot.prompt_len = len(tokens) if prompt_len is None else min(prompt_len, len(tokens))
        slot.used = self._tick()

    def evict_one(self) -> Evicted | None:
        """The idle slot with KV ``victim`` picks, emptied (the engine clears its cells); None: none."""
        idle = [s for s in self.slots if not s.busy and s.tokens]
        if not idle:
            return None
        victim = self.victim(idle)
        gone = Evicted(victim.seq, victim.salt, victim.tokens)
        victim.tokens = []
        return gone

    def cached_tokens(self) -> int:
        """Tokens held by idle slots (what the cache keeps beyond the running requests)."""
        return sum(len(s.tokens) for s in self.slots if not s.busy)
