"""`laya.load("auto")`: the English and the multilingual checkpoint behind one `predict`, each state
sent to the one that can read it, by upstream's script and language rules (`laya.routing`).

The English checkpoint does not degrade gracefully off English (upstream measured it near chance on
Hindi and Korean, and confident while wrong), so the decision is made per state, before anything is
tokenised, and reported on every answer: `x_routed_to` (the model that answered) and
`x_route_reason` (why, in upstream's words). The server's `"model": "auto"` makes the same decision
with the same function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from laya.errors import QuestionError
from laya.request import AS_GIVEN, MAX_LANG_CHARS, Overflow

if TYPE_CHECKING:
    from laya.routing import Route

AUTO = "auto"  # the model name that routes
ROLES = ("english", "multilingual")
# Served names that say which checkpoint a model is: the registered names, or an operator's NAME=.
ROLE_NAMES = {"english": ("laya", "english"), "multilingual": ("laya-multilingual", "multilingual")}


def roles_of(names: Sequence[str]) -> dict[str, str] | None:
    """The served model playing each role, or None when one of the two is not served."""
    out = {}
    for role, known in ROLE_NAMES.items():
        found = [n for n in names if n.lower() in known]
        if not found:
            return None
        out[role] = found[0]
    return out


def check_lang(lang: Any) -> str | None:
    """A language code hint (`"de"`, `"pt-BR"`, blank for none) or a clear error."""
    if lang is None:
        return None
    if not isinstance(lang, str) or len(lang) > MAX_LANG_CHARS:
        raise QuestionError(f"lang must be a language code such as 'en' or 'pt-BR', got {str(lang)[:40]!r}",
                            error_type="invalid_lang")
    return lang


def by_role(routes: Sequence[Route]) -> list[tuple[str, list[int]]]:
    """The states each role answers (their indices, in order), roles with none left out: what a
    routed batch sends to each model, one model after the other."""
    out = []
    for role in ROLES:
        idx = [i for i, r in enumerate(routes) if r.model == role]
        if idx:
            out.append((role, idx))
    return out


class Router:
    """Two loaded models and the rule choosing between them; `default` takes a state whose language
    nothing identifies (upstream's default since 0.4.0: multilingual)."""

    def __init__(self, english: Any, multilingual: Any, *, default: str = "multilingual") -> None:
        if default not in ROLES:
            raise ValueError(f"default must be one of {', '.join(ROLES)}, got {default!r}")
        self.models = {"english": english, "multilingual": multilingual}
        self.default = default
        self.name = "auto"

    def route(self, state: Any, lang: str | None = None) -> Route:
        from laya.routing import route  # its tables load with the first routed state

        return route(state, lang=check_lang(lang), default=self.default)

    def predict_batch(self, states: Sequence[Any], questions: Mapping[str, Any], *, lang: str | None = None,
                      tournament: int | None = None, min_confidence: Any = None, overflow: Overflow = None,
                      order: str = AS_GIVEN, strict: bool = False) -> list[dict[str, Any]]:
        """Each state answered by its model; states sent to the same model share its forward passes. The
        options are `Model.predict_batch`'s; a strict answer leaves the route out too (an `x_` field)."""
        routes = [self.route(s, lang) for s in states]
        out: list[dict[str, Any] | None] = [None] * len(states)
        for role, idx in by_role(routes):
            model = self.models[role]
            for i, response in zip(idx, model.predict_batch([states[i] for i in idx], questions, tournament,
                                                            min_confidence=min_confidence, overflow=overflow,
                                                            order=order, strict=strict)):
                routed = {} if strict else {"x_routed_to": model.name, "x_route_reason": routes[i].reason}
                out[i] = {**response, **routed}
        return out  # type: ignore[return-value]

    def predict(self, state: Any, questions: Mapping[str, Any], *, lang: str | None = None,
                tournament: int | None = None, min_confidence: Any = None, overflow: Overflow = None,
                order: str = AS_GIVEN, strict: bool = False) -> dict[str, Any]:
        return self.predict_batch([state], questions, lang=lang, tournament=tournament,
                                  min_confidence=min_confidence, overflow=overflow, order=order, strict=strict)[0]

    def predict_long(self, state: Any, questions: Mapping[str, Any], window: int | None = None,
                     stride: int | None = None, aggregate: str = "auto", *, lang: str | None = None
                     ) -> dict[str, Any]:
        decision = self.route(state, lang)
        model = self.models[decision.model]
        response = model.predict_long(state, questions, window, stride, aggregate)
        return {**response, "x_routed_to": model.name, "x_route_reason": decision.reason}

    def decide_batch(self, states: Sequence[Any], schema: Any = None, *, lang: str | None = None,
                     questions: Mapping[str, Any] | None = None, return_details: bool = False,
                     min_confidence: Any = None, tournament: int | None = None) -> list[Any]:
        """Typed values per state, each decided by its model (`route` says which and why)."""
        routes = [self.route(s, lang) for s in states]
        out: list[Any] = [None] * len(states)
        for role, idx in by_role(routes):
            values = self.models[role].decide_batch([states[i] for i in idx], schema, questions=questions,
                                                    return_details=return_details, min_confidence=min_confidence,
                                                    tournament=tournament)
            for i, value in zip(idx, values):
                out[i] = value
        return out

    def decide(self, state: Any, schema: Any = None, *, lang: str | None = None,
               questions: Mapping[str, Any] | None = None, return_details: bool = False,
               min_confidence: Any = None, tournament: int | None = None) -> Any:
        return self.decide_batch([state], schema, lang=lang, questions=questions, return_details=return_details,
                                 min_confidence=min_confidence, tournament=tournament)[0]

    def describe(self) -> dict[str, Any]:
        return {"kind": "router", "default": self.default,
                **{role: getattr(m, "name", str(m)) for role, m in self.models.items()}}

    def __repr__(self) -> str:
        return (f"Router(english={self.models['english'].name!r}, multilingual={self.models['multilingual'].name!r},"
                f" default={self.default!r})")
