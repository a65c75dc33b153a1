"""The decide policy over token ids and a logit row: where the prefix ends, which choices can be
told apart, how they are scored, and when the kept prefix state is restored, extended or stored.

No llama.cpp here: a `DecideBackend` does the model work. Every refusal happens before anything is
prefilled, so a refused request leaves the session exactly as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from laya.decide.backend import DecideBackend
from laya.errors import QuestionError
from laya.heads.decode import probabilities

POLICIES = ("auto", "on", "off")


class DecideRefused(QuestionError):
    """A decision that cannot be made as asked (refused before any prefill)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def split_prompt(backend: DecideBackend, prefix: str, suffix: str) -> tuple[list[int], int]:
    """Tokens of the whole prompt and how many of them are the prefix, found on tokens.

    The template is rendered over `prefix + suffix` as one message; the prefix is also rendered
    alone, and the two renderings agree up to the join. One matching token is given back: a merge
    across the join can make the last shared-looking token a different token in context.
    """
    full = backend.prompt_tokens(prefix + suffix)
    alone = backend.prompt_tokens(prefix) if prefix else []
    shared = common_prefix(full, alone)
    return full, max(0, shared - 1)


def first_tokens(backend: DecideBackend, labels: list[str]) -> list[int]:
    """The standalone first token of each label; refuses an empty list and colliding labels."""
    if not labels:
        raise DecideRefused("a decision needs at least one choice")
    ids = []
    for label in labels:
        tokens = backend.tokenize(label)
        if not tokens:
            raise DecideRefused(f"choice {label!r} has no tokens")
        ids.append(tokens[0])
    seen: dict[int, str] = {}
    for label, token in zip(labels, ids):
        if token in seen:
            raise DecideRefused(f"choices {seen[token]!r} and {label!r} start with the same token and cannot be "
                                "told apart by first-token scoring")
        seen[token] = label
    return ids


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    m = z.max()
    return z - m - np.log(np.exp(z - m).sum())


@dataclass(frozen=True)
class Scores:
    logp: np.ndarray  # log p of each choice's first token, over the whole vocabulary
    probabilities: np.ndarray  # softmax(logp / T) over the choices
    outside_mass: float  # probability the model put on tokens that are none of the choices


def score(logits: np.ndarray, choice_ids: list[int], temperature: float = 1.0) -> Scores:
    logp = log_softmax(logits)[choice_ids]
    p = probabilities(logp, temperature)
    outside = float(max(0.0, 1.0 - np.exp(logp).sum()))
    return Scores(logp=logp, probabilities=p, outside_mass=outside)


@dataclass
class KeptPrefix:
    tokens: list[int]
    state: Any
    nbytes: int


@dataclass
class PrefixCache:
    """One kept state: the latest prefix. Bounded in bytes; `auto` keeps it on a CPU backend,
    where prefilling in two pieces costs about what the pieces cost together."""

    policy: str = "auto"
    max_bytes: int = 512 * 1024 * 1024
    kept: KeptPrefix | None = None

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"prefix cache policy must be one of {POLICIES}, got {self.policy!r}")

    @property
    def enabled(self) -> bool:
        return self.policy != "off"

    def match(self, tokens: list[int]) -> KeptPrefix | None:
        """The kept prefix if `tokens` (a new prefix) renders to it or extends it."""
        kept = self.kept
        if kept is None or len(kept.tokens) > len(tokens) or tokens[: len(kept.tokens)] != kept.tokens:
            return None
        return kept

    def drop(self) -> None:
        self.kept = None


@dataclass
class Report:
    """What one decision cost."""

    n_tokens: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    prefill_ms: float = 0.0
    restore_ms: float = 0.0
    store_ms: float = 0.0
    stored_bytes: int = 0  # the state this decision kept of its own prefix (0 when it kept none)

    def as_extras(self) -> dict[str, Any]:
        """Only what this request reused, prefilled and stored: no figure about another caller's state."""
        return {"reused_tokens": self.reused_tokens, "prefilled_tokens": self.prefilled_tokens,
                "prefill_ms": round(self.prefill_ms, 3), "restore_ms": round(self.restore_ms, 3),
                "store_ms": round(self.store_ms, 3), "stored_state_bytes": self.stored_bytes}


class Decider:
    """One decision start to finish over a backend, with the prefix cache."""

    def __init__(self, backend: DecideBackend, cache: PrefixCache | None = None):
        self.backend = backend
        self.cache = cache or PrefixCache()

    def _prefill(self, tokens: list[int], report: Report) -> None:
        if tokens:
            started = time.perf_counter()
            self.backend.prefill(tokens)
            report.prefill_ms += (time.perf_counter() - started) * 1000.0
            report.prefilled_tokens += len(tokens)

    def _store(self, tokens: list[int], report: Report) -> None:
        started = time.perf_counter()
        state = self.backend.save_state()
        nbytes = self.backend.state_nbytes(state)
        report.store_ms += (time.perf_counter() - started) * 1000.0
        if nbytes <= self.cache.max_bytes:
            self.cache.kept = KeptPrefix(tokens=list(tokens), state=state, nbytes=nbytes)
            report.stored_bytes = nbytes
        else:
            self.cache.drop()

    def decide(self, prefix: str, suffix: str, labels: list[str], *, temperature: float = 1.0,
               reuse_prefix: bool = True) -> tuple[Scores, Report]:
        backend = self.backend
        # Every check before any prefill: a refusal leaves the session as it was.
        choice_ids = first_tokens(backend, labels)
        full, n_prefix = split_prompt(backend, prefix, suffix)
        if len(full) > backend.n_ctx:
            raise DecideRefused(f"the prompt takes {len(full)} tokens; the model's context holds {backend.n_ctx}",
                                error_type="max_tokens_exceeded")
        if len(full) == n_prefix:
            raise DecideRefused("the prompt has no question after its prefix")
        report = Report(n_tokens=len(full))
        use_cache = reuse_prefix and self.cache.enabled
        if not use_cache:
            backend.reset()
            self._prefill(full, report)
        else:
            prefix_tokens = full[:n_prefix]
            kept = self.cache.match(prefix_tokens)
            if kept is not None:
                started = time.perf_counter()
                backend.load_state(kept.state)
                report.restore_ms = (time.perf_counter() - started) * 1000.0
                report.reused_tokens = len(kept.tokens)
                if len(kept.tokens) < n_prefix:  # the prefix grew: prefill the rest, keep the longer one
                    self._prefill(prefix_tokens[len(kept.tokens) :], report)
                    self._store(prefix_tokens, report)
            else:
                backend.reset()
                self._prefill(prefix_tokens, report)
                self._store(prefix_tokens, report)
            self._prefill(full[n_prefix:], report)
        return score(backend.last_logits(), choice_ids, temperature), report
