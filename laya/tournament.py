"""Tournaments: choices with more options than one encoder row can hold, answered by elimination.

The rounds follow upstream laya's `laya.shortlist.predict_tournament` (group 16): a choice's labels
are cut, in criteria order, into near-equal groups of at most `group` labels; every group is asked
as a question of its own (all groups of a round share forward passes); each group's top answer goes
through; rounds repeat while more than `group` labels remain; then one final row over the finalists.
So the final row's probabilities over the finalists are upstream's.

System One wants a probability for every option, summing to 1, and an eliminated option is not
impossible. Each option gets its share through the rounds it lost: an option eliminated in a group
gets `P(its group's winner) x p_group(option) / p_group(winner)`, the winner's probability being its
own share from the later rounds (the final row's probability for a finalist). No option can then
outscore the group winner it lost to, and the finalists keep the final row's odds between them;
all shares are then normalised to sum to 1. Everything here is plain Python over option indices
and probability vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from laya.questions import Question

DEFAULT_GROUP = 16
MIN_GROUP, MAX_GROUP = 2, 255  # the group sizes a request may ask for (`tournament`)


def group_problem(value: object) -> str | None:
    """Why `value` is not a tournament group size (an integer from 2 to 255), or None."""
    if value is None or (not isinstance(value, bool) and isinstance(value, int) and MIN_GROUP <= value <= MAX_GROUP):
        return None
    return f"tournament must be a group size from {MIN_GROUP} to {MAX_GROUP}, got {str(value)[:40]!r}"


def tournament_rows(n_options: int, group: int) -> int:
    """Rows a tournament of `n_options` in groups of `group` takes: every group of every round, and
    the final row."""
    n, total = n_options, 1
    while n > group:
        n = -(-n // group)
        total += n
    return total


def groups_of(indices: list[int], group: int) -> list[list[int]]:
    """`indices` cut in order into ceil(n / group) near-equal groups (upstream's cut)."""
    n = len(indices)
    parts = -(-n // group)
    return [indices[i * n // parts : (i + 1) * n // parts] for i in range(parts)]


def narrowed(question: Question, keep: list[int]) -> Question:
    """The question with only the options at `keep` (in order): a group, or the finalists."""
    return replace(question, keys=tuple(question.keys[i] for i in keep),
                   options=tuple(question.options[i] for i in keep), names=tuple(question.names[i] for i in keep),
                   descriptions=tuple(question.descriptions[i] for i in keep))


@dataclass
class Round:
    """One round of one question: its groups (option indices) and each group's probabilities."""

    groups: list[list[int]]
    probabilities: list[np.ndarray] = field(default_factory=list)


@dataclass
class Tournament:
    """The elimination of one choice question over one state."""

    question: Question
    group: int
    alive: list[int] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.alive:
            self.alive = list(range(self.question.n_options))

    @property
    def done(self) -> bool:
        return len(self.alive) <= self.group

    def next_round(self) -> list[Question]:
        """The group questions of the next round."""
        played = Round(groups_of(self.alive, self.group))
        self.rounds.append(played)
        return [narrowed(self.question, g) for g in played.groups]

    def record(self, probabilities: list[np.ndarray]) -> None:
        """Each group's (tempered) probabilities, in group order; its top answer goes through."""
        played = self.rounds[-1]
        played.probabilities = [np.asarray(p, dtype=np.float64) for p in probabilities]
        self.alive = [g[int(np.argmax(p))] for g, p in zip(played.groups, played.probabilities)]

    def finalists(self) -> Question:
        return narrowed(self.question, self.alive)

    def shares(self, final: np.ndarray) -> np.ndarray:
        """Every option's probability from the final row's `final` (over `alive`) and the rounds."""
        share = np.zeros(self.question.n_options, dtype=np.float64)
        share[self.alive] = np.asarray(final, dtype=np.float64)
        for played in reversed(self.rounds):
            for g, p in zip(played.groups, played.probabilities):
                winner = int(np.argmax(p))
                scale = share[g[winner]] / p[winner] if p[winner] > 0 else 0.0
                for j, option in enumerate(g):
                    if j != winner:
                        share[option] = scale * p[j]
        total = share.sum()
        return share / total if total > 0 else share

    def report(self, final: np.ndarray) -> dict:
        """`x_tournament`: rounds, groups per round, the finalists and the final row's probabilities."""
        keys = self.question.keys
        return {"rounds": len(self.rounds), "groups": [len(r.groups) for r in self.rounds],
                "finalists": [keys[i] for i in self.alive],
                "final_probabilities": {keys[i]: float(p) for i, p in zip(self.alive, final)}}
