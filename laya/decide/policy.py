"""The decide policy over token ids and a logit row: where the prefix ends, which choices can be
told apart, how they are scored, and when the kept prefix state is restored, extended or stored.

No llama.cpp here: a `DecideBackend` does the model work. Every refusal happens before anything is
prefilled, so a refused request leaves the session exactly as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from laya.decide.backend import DecideBackend
from laya.decoding.decode import probabilities
from laya.errors import QuestionError

POLICIES = ("auto", "on", "off")


class DecideRefused(QuestionError):
    """A decision that cannot be made as asked (refused before any prefill)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def split_prompt(backend: DecideBackend, prefix: str, suffix: str, alone: list[int] | None = None
                 ) -> tuple[list[int], int]:
    """Tokens of the whole prompt and how many of them are the prefix, found on tokens.

    The template is rendered over `prefix + suffix` as one message; the prefix is also rendered
    alone (`alone`, when the caller already has it: one state's questions share it), and the two
    renderings agree up to the join. One matching token is given back: a merge across the join can
    make the last shared-looking token a different token in context.
    """
    full = backend.prompt_tokens(prefix + suffix)
    if alone is None:
        alone = backend.prompt_tokens(prefix) if prefix else []
    shared = common_prefix(full, alone)
    return full, max(0, shared - 1)


def label_tokens(backend: DecideBackend, labels: list[str]) -> list[tuple[int, ...]]:
    """Each label's standalone tokens; refuses an empty list, an empty label and two labels with the
    same tokens (the only collision the tree cannot resolve)."""
    if not labels:
        raise DecideRefused("a decision needs at least one choice")
    seen: dict[Any, Any]
    seqs, seen = [], {}
    for label in labels:
        tokens = tuple(backend.tokenize(label))
        if not tokens:
            raise DecideRefused(f"choice {label[:100]!r} has no tokens")
        if tokens in seen:
            raise DecideRefused(f"choices {seen[tokens][:100]!r} and {label[:100]!r} are the same tokens and cannot "
                                "be told apart", error_type="identical_options")
        seen[tokens] = label
        seqs.append(tokens)
    return seqs


@dataclass(frozen=True)
class Prompt:
    """One decision tokenised and checked, so that running it tokenises nothing: the whole prompt,
    how many of its tokens are the prefix (the part a later decision over the same state reuses),
    and each label's tokens."""

    tokens: list[int]
    n_prefix: int
    labels: list[tuple[int, ...]]
    # the letters readout: each option's letter tokens, read from the top tokens instead of `labels`
    letters: tuple[tuple[int, ...], ...] | None = None
    n_schema: int = 0  # leading prefix tokens that depend on the questions only (json-field's system turn)


def tokenised(backend: DecideBackend, prefix: str, suffix: str, labels: list[str],
              alone: list[int] | None = None) -> Prompt:
    """Every check a decision makes before any prefill (labels, the context, a question after the
    prefix), done once: a refusal leaves the session as it was."""
    seqs = label_tokens(backend, labels)
    full, n_prefix = split_prompt(backend, prefix, suffix, alone)
    if len(full) > backend.n_ctx:
        raise DecideRefused(f"the prompt takes {len(full)} tokens; the model's context holds {backend.n_ctx}",
                            error_type="max_tokens_exceeded")
    if len(full) == n_prefix:
        raise DecideRefused("the prompt has no question after its prefix")
    return Prompt(full, n_prefix, seqs)


def logsumexp(values: np.ndarray) -> float:
    m = float(np.max(values))
    return m + float(np.log(np.exp(values - m).sum()))


@dataclass
class TreeResult:
    logp: np.ndarray  # each label's log-probability: its path through the tree (joint, over the vocabulary)
    levels: int  # deepest level read (1: the first tokens told every label apart)
    passes: int  # forward passes beyond the prompt's


def collision_tree(backend: DecideBackend, seqs: list[tuple[int, ...]], root: np.ndarray, *, budget: int = 8,
                   max_levels: int = 32) -> TreeResult:
    """Log-probabilities of labels whose tokens may share beginnings, read level by level.

    `root` is the log-softmax after the prompt (the backend holds that state). Labels sharing a token
    at a level form a group; a group that could hold the best answer is always expanded by its token
    (one short forward pass from the saved prompt state), so `choice` is never a guess; other groups
    are expanded too while `budget` passes remain, largest first, and past the budget (or
    `max_levels`) a group's probability is split equally among its members, as pcdServer does. A
    label that ends where others go on reads the probability of an end-of-answer token there."""
    n = len(seqs)
    logp = np.full(n, -np.inf)
    firsts = {seq[0] for seq in seqs}
    if len(firsts) == n:  # the common case: first tokens tell every label apart
        for i, seq in enumerate(seqs):
            logp[i] = root[seq[0]]
        return TreeResult(logp, 1, 0)
    prompt_state = backend.save_state()
    end = [t for t in backend.end_tokens if 0 <= t < len(root)]
    pending: list[tuple[float, list[int], int, tuple[int, ...]]] = []
    levels, passes = 1, 0

    def split(members: list[int], depth: int, base: float, path: tuple[int, ...], here: np.ndarray) -> None:
        groups: dict[int, list[int]] = {}
        for m in members:
            if len(seqs[m]) == depth:  # this label ends here: the answer stops
                logp[m] = base + (logsumexp(here[end]) if end else -np.inf)
            else:
                groups.setdefault(seqs[m][depth], []).append(m)
        for token, group in groups.items():
            score = base + float(here[token])
            if len(group) == 1:
                logp[group[0]] = score
            else:
                pending.append((score, group, depth + 1, (*path, token)))

    split(list(range(n)), 0, 0.0, (), root)
    while pending:
        pending.sort(key=lambda item: item[0])
        score, group, depth, path = pending.pop()
        best = float(np.max(logp)) if np.isfinite(logp).any() else -np.inf
        may_win = score >= best
        if depth > max_levels or not (may_win or passes < budget):
            logp[group] = score - np.log(len(group))
            continue
        if passes:  # the first expansion starts from the prompt the backend already holds
            backend.load_state(prompt_state)
        backend.prefill(list(path))
        passes += 1
        levels = max(levels, depth + 1)
        split(group, depth, score, path, log_softmax(backend.last_logits()))  # score: log p(path)
    return TreeResult(logp, levels, passes)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    m = z.max()
    return z - m - np.log(np.exp(z - m).sum())


@dataclass(frozen=True)
class Scores:
    logp: np.ndarray  # log p of each choice's first token, over the whole vocabulary
    probabilities: np.ndarray  # softmax(logp / T) over the choices
    outside_mass: float  # probability the model put on tokens that are none of the choices


def letter_scores(root: np.ndarray, letters: tuple[tuple[int, ...], ...], top: int) -> Scores:
    """slot's letters readout: an option's mass is that of every token among the `top` likeliest
    whose trimmed text is its letter, renormalised over the options (log-masses returned, so the
    softmax of `Evidence` renormalises). A letter outside the top tokens reads nothing; options none of
    whose letters are there read as equally unlikely (the model did not answer with a letter)."""
    k = min(top, len(root))
    best = set(np.argpartition(-root, k - 1)[:k].tolist())
    mass = np.array([sum(float(np.exp(root[t])) for t in ids if t in best) for ids in letters])
    outside = float(max(0.0, 1.0 - mass.sum()))
    # a letter with no mass reads 1e-30 of it (not log 0): the evidence stays finite
    logp = np.zeros(len(letters)) if mass.sum() <= 0.0 else np.log(np.maximum(mass, 1e-30))
    return Scores(logp=logp, probabilities=probabilities(logp, 1.0), outside_mass=outside)


def score(root: np.ndarray, logp: np.ndarray, seqs: list[tuple[int, ...]], temperature: float = 1.0) -> Scores:
    """`root`: log-softmax after the prompt; `logp`: each label's log-probability (its tree path)."""
    firsts = sorted({seq[0] for seq in seqs})
    outside = float(max(0.0, 1.0 - np.exp(root[firsts]).sum()))
    return Scores(logp=logp, probabilities=probabilities(logp, temperature), outside_mass=outside)


@dataclass
class KeptPrefix:
    tokens: list[int]
    state: Any
    nbytes: int
    pieces: tuple[int, ...] = ()  # the prefills that computed it, in order (what a replay must repeat)


@dataclass
class PrefixCache:
    """The kept states: the latest prefix, and the latest schema prefix (json-field's system turn,
    which depends on the questions only and so outlives a state). Each bounded in bytes; `auto` keeps
    them on a CPU backend, where prefilling in two pieces costs about what the pieces cost together."""

    policy: str = "auto"
    max_bytes: int = 512 * 1024 * 1024
    kept: KeptPrefix | None = None
    schema: KeptPrefix | None = None

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

    def match_schema(self, tokens: list[int]) -> KeptPrefix | None:
        """The kept schema prefix if `tokens` are exactly it."""
        schema = self.schema
        return schema if schema is not None and schema.tokens == tokens else None

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
    levels: int = 1  # collision tree: levels read (1 when the first tokens told the choices apart)
    tree_passes: int = 0  # collision tree: forward passes beyond the prompt's
    pieces: list[int] = field(default_factory=list)  # the prompt's prefills in order, restored ones included

    def as_extras(self) -> dict[str, Any]:
        """Only what this request reused, prefilled and stored: no figure about another caller's state."""
        return {"reused_tokens": self.reused_tokens, "prefilled_tokens": self.prefilled_tokens,
                "prefill_ms": round(self.prefill_ms, 3), "restore_ms": round(self.restore_ms, 3),
                "store_ms": round(self.store_ms, 3), "stored_state_bytes": self.stored_bytes,
                "levels": self.levels, "tree_passes": self.tree_passes}


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
            report.pieces.append(len(tokens))

    def _store(self, tokens: list[int], report: Report, schema: bool = False) -> None:
        started = time.perf_counter()
        state = self.backend.save_state()
        nbytes = self.backend.state_nbytes(state)
        report.store_ms += (time.perf_counter() - started) * 1000.0
        kept = (KeptPrefix(tokens=list(tokens), state=state, nbytes=nbytes, pieces=tuple(report.pieces))
                if nbytes <= self.cache.max_bytes else None)
        if schema:
            self.cache.schema = kept
        else:
            self.cache.kept = kept
        report.stored_bytes += nbytes if kept is not None else 0

    def decide(self, prefix: str, suffix: str, labels: list[str], *, temperature: float = 1.0,
               reuse_prefix: bool = True, tree_budget: int = 8) -> tuple[Scores, Report]:
        return self.run(tokenised(self.backend, prefix, suffix, labels), temperature=temperature,
                        reuse_prefix=reuse_prefix, tree_budget=tree_budget)

    def run(self, prompt: Prompt, *, temperature: float = 1.0, reuse_prefix: bool = True, tree_budget: int = 8,
            top: int = 100) -> tuple[Scores, Report]:
        """One decision over a prompt `tokenised` beforehand (its checks already passed)."""
        backend = self.backend
        full, n_prefix, seqs = prompt.tokens, prompt.n_prefix, prompt.labels
        report = Report(n_tokens=len(full))
        use_cache = reuse_prefix and self.cache.enabled
        if not use_cache:
            backend.reset()
            self._prefill(full, report)
        else:
            prefix_tokens = full[:n_prefix]
            kept = self.cache.match(prefix_tokens)
            if kept is None and prompt.n_schema:  # the same fields' system turn, over another state
                kept = self.cache.match_schema(full[: prompt.n_schema])
            if kept is not None:
                started = time.perf_counter()
                backend.load_state(kept.state)
                report.restore_ms = (time.perf_counter() - started) * 1000.0
                report.pieces = list(kept.pieces)
                report.reused_tokens = len(kept.tokens)
                if len(kept.tokens) < n_prefix:  # the prefix grew: prefill the rest, keep the longer one
                    self._prefill(prefix_tokens[len(kept.tokens) :], report)
                    self._store(prefix_tokens, report)
            else:
                backend.reset()
                if prompt.n_schema:
                    self._prefill(prefix_tokens[: prompt.n_schema], report)
                    self._store(prefix_tokens[: prompt.n_schema], report, schema=True)
                self._prefill(prefix_tokens[prompt.n_schema :], report)
                self._store(prefix_tokens, report)
            self._prefill(full[n_prefix:], report)
        root = log_softmax(backend.last_logits())
        if prompt.letters is not None:
            return letter_scores(root, prompt.letters, top), report
        tree = collision_tree(backend, seqs, root, budget=tree_budget)
        report.levels, report.tree_passes = tree.levels, tree.passes
        return score(root, tree.logp, seqs, temperature), report
