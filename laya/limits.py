"""How much work one request may ask for: every bound a server puts on a request, in one place.

A caller may be hostile, so each request's work is bounded before it is done: states and questions
are counted before either is validated, rows (states x questions) before any is built, tokens as the
rows are really built (both engines), and decisions (prompts scored) on the decide engine. A request
over a limit is refused (HTTP 413) with `error_type` naming the limit and the flag that sets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from laya.errors import QuestionError


class LimitExceeded(QuestionError):
    """A request asks for more work than the server allows (HTTP 413)."""

    def __init__(self, what: str, got: int, limit: int, flag: str):
        super().__init__(f"the request asks for {got} {what}; this server allows at most {limit} ({flag})",
                         error_type=f"max_{what.replace(' ', '_')}_exceeded")
        self.what, self.flag, self.limit, self.got = what, flag, limit, got

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (LimitExceeded, (self.what, self.got, self.limit, self.flag))


@dataclass(frozen=True)
class Limits:
    """Defaults sized for one CPU machine; every one is a `laya serve` flag."""

    max_questions: int = 64  # --max-questions: questions per request
    max_states: int = 256  # --max-states: states per /batch request
    max_rows: int = 1024  # --max-rows: rows (states x questions) per request
    max_tokens: int = 131072  # --max-request-tokens: tokens per request, counted as the rows are built
    max_decisions: int = 512  # --max-decisions: prompts scored per request on the decide engine

    def bound(self, what: str) -> tuple[int, str]:
        """The limit on `what` and the `laya serve` flag that sets it."""
        return {
            "questions": (self.max_questions, "--max-questions"),
            "states": (self.max_states, "--max-states"),
            "rows": (self.max_rows, "--max-rows"),
            "tokens": (self.max_tokens, "--max-request-tokens"),
            "decisions": (self.max_decisions, "--max-decisions"),
        }[what]

    def check(self, what: str, got: int) -> None:
        limit, flag = self.bound(what)
        if got > limit:
            raise LimitExceeded(what, got, limit, flag)

    def published(self) -> dict[str, int]:
        """The limits a caller plans by (`/v1/models`, `/health`): this server's per request, and the
        contract's options per choice question."""
        from laya.questions import MAX_LEVELS, MAX_OPTIONS

        return {"states": self.max_states, "questions": self.max_questions, "rows": self.max_rows,
                "tokens": self.max_tokens, "decisions": self.max_decisions, "options": MAX_OPTIONS,
                "levels": MAX_LEVELS}

    def times(self, factor: int) -> Limits:
        """Every limit `factor` times higher: what a plan counts to, so that it can say by how much a
        request is over while its own work stays bounded."""
        return Limits(max_questions=self.max_questions * factor, max_states=self.max_states * factor,
                      max_rows=self.max_rows * factor, max_tokens=self.max_tokens * factor,
                      max_decisions=self.max_decisions * factor)

UNLIMITED = Limits(max_questions=1 << 62, max_states=1 << 62, max_rows=1 << 62, max_tokens=1 << 62,
                   max_decisions=1 << 62)
