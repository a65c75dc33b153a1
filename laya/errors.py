"""Exceptions that name the problem, so the CLI and the server can turn them into clear messages.

Every user-facing failure is one of these; anything else escaping the library is a bug.
"""

from __future__ import annotations

from typing import Any


class LayaError(Exception):
    """Base of every error the library raises on purpose."""


class CheckpointError(LayaError, ValueError):
    """A checkpoint folder, file or tensor is missing, malformed or does not match the format."""


class QuestionError(LayaError, ValueError):
    """A question (or the request around it) cannot be answered as asked."""

    def __init__(self, message: str, qid: str | None = None, error_type: str = "invalid_question"):
        super().__init__(message)
        self.qid = qid
        self.error_type = error_type

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # keeps qid and error_type across processes
        return (QuestionError, (str(self), self.qid, self.error_type))


class RuntimeUnavailable(LayaError, RuntimeError):
    """A runtime was asked for that is not installed or cannot run on this platform."""


class Cancelled(LayaError):
    """The caller went away (disconnected or timed out); the rest of its work was not done."""
