"""Shortlists: a choice of many options answered on the K nearest to the state. The state (with the
question's instructions) and each option are embedded, the options ranked by cosine similarity to the
state, and the model answers the top K (in rank order) in one predict. Beside the tournament, the way
to ask a question of hundreds of intents at the cost of a few dozen.

The embedder defaults to the checkpoint's own encoder, mean-pooled over the non-padding tokens of
each text (special tokens included where the tokenizer adds them), as upstream laya's
`embed_fn_from_agent` reads it: the reference encoder in fp32, texts cut at 512 tokens, in chunks of
32 padded to their longest. Any `embed_fn(texts) -> array [n, dim]` can replace it; `cached_embed_fn`
keeps the embeddings of texts seen before (an option set asked again costs only its state).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from laya.decoding.confidence import choice_confidence
from laya.errors import QuestionError
from laya.orders import reordered
from laya.request import Request
from laya.response import Answer

EmbedFn = Callable[[Sequence[Any]], np.ndarray]
DEFAULT_K = 20
MAX_LENGTH, BATCH_SIZE = 512, 32
_EMBEDDERS: weakref.WeakKeyDictionary[Any, EmbedFn] = weakref.WeakKeyDictionary()
_EMBEDDERS_LOCK = threading.Lock()


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def embed_fn_from_model(model: Any, max_length: int = MAX_LENGTH, batch_size: int = BATCH_SIZE) -> EmbedFn:
    """The checkpoint's own encoder as an embedder: each text's last hidden states (after the final
    norm) averaged over its non-padding tokens, fp32, whatever runtime answers (the reference encoder
    is loaded beside another runtime the first time it is needed)."""
    _positive("max_length", max_length)
    _positive("batch_size", batch_size)
    import torch

    from laya.encoder.runtimes.pytorch import reference_net

    encoder: Any = reference_net(model.runtime, model.checkpoint).encoder  # a transformers ModernBertModel
    backend = _truncating(model.tokenizer.backend, max_length)
    pad_id = model.tokenizer.pad_id

    def embed(texts: Sequence[Any]) -> np.ndarray:
        texts = ["" if t is None else str(t) for t in texts]
        if not texts:
            return np.zeros((0, encoder.config.hidden_size), np.float32)
        out = []
        for start in range(0, len(texts), batch_size):
            encoded = backend.encode_batch(texts[start:start + batch_size], add_special_tokens=True)
            width = max(len(e.ids) for e in encoded)
            ids = torch.tensor([e.ids + [pad_id] * (width - len(e.ids)) for e in encoded], dtype=torch.long)
            mask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encoded], dtype=torch.long)
            with torch.inference_mode():
                hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
                weights = mask[..., None].to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
            out.append(pooled.float().cpu().numpy())
        return np.concatenate(out).astype(np.float32)

    return embed


def _truncating(backend: Any, max_length: int) -> Any:
    """A copy of the tokenizer that cuts at `max_length` tokens, special tokens counted (as a Hugging
    Face tokenizer called with `truncation=True` does); the model's own tokenizer is left as it is."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.no_padding()
    copy.enable_truncation(max_length)
    return copy


def cached_embed_fn(embed_fn: EmbedFn, maxsize: int = 4096) -> EmbedFn:
    """`embed_fn` with the embeddings of the last `maxsize` texts kept (least recently used out first):
    the texts not seen before are embedded together in one call; thread-safe."""
    _positive("maxsize", maxsize)
    kept: OrderedDict[str, np.ndarray] = OrderedDict()
    lock = threading.Lock()

    def embed(texts: Sequence[Any]) -> np.ndarray:
        keys = ["" if t is None else str(t) for t in texts]
        if not keys:
            return np.zeros((0, 0), np.float32)
        with lock:
            missing = list(dict.fromkeys(k for k in keys if k not in kept))
        if missing:
            fresh = _matrix(embed_fn(missing), len(missing))
            with lock:
                for key, row in zip(missing, fresh):
                    kept[key] = row
                    kept.move_to_end(key)
        with lock:
            rows = []
            for key in keys:
                row = kept.get(key)
                if row is None:  # pushed out by another thread's texts meanwhile
                    row = _matrix(embed_fn([key]), 1)[0]
                kept[key] = row
                kept.move_to_end(key)
                rows.append(row)
            while len(kept) > maxsize:
                kept.popitem(last=False)
        return np.stack(rows)

    return embed


def _matrix(values: Any, n: int) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().float().cpu().numpy()
    out = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if out.ndim != 2 or out.shape[0] != n or out.shape[1] < 1:
        raise ValueError(f"embed_fn must return an array of shape ({n}, dim), got {out.shape}")
    return out.astype(np.float32) if out.dtype != np.float32 else out


def criteria_items(criteria: Any) -> list[tuple[str, Any]]:
    """A choice's options as (label, description) pairs, in order; refused if empty or repeated."""
    if isinstance(criteria, Mapping):
        items = [(str(k), v) for k, v in criteria.items()]
    elif isinstance(criteria, list):
        items = [(str(item), None) for item in criteria]
    else:
        raise TypeError(f"criteria must be a dict or a list, got {type(criteria).__name__}")
    if not items:
        raise ValueError("criteria must not be empty")
    labels = [label for label, _ in items]
    if len(set(labels)) != len(labels):
        raise ValueError("criteria name an option twice")
    return items


def query_text(state: Any, instructions: Any = None) -> str:
    body = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    if instructions is None or instructions == "":
        return body
    said = instructions if isinstance(instructions, str) else json.dumps(instructions, ensure_ascii=False)
    return f"{said}\n{body}"


def option_text(label: str, description: Any) -> str:
    if description is None or description == "":
        return label
    said = description if isinstance(description, str) else json.dumps(
        description, ensure_ascii=False, separators=(", ", ": "), default=str)
    return f"{label}: {said}"


def shortlist_choice(state: Any, criteria: Any, embed_fn: EmbedFn, k: int = DEFAULT_K, *,
                     instructions: Any = None) -> tuple[list[str], list[float] | None]:
    """The `k` options nearest the state (with the instructions), best first, and their cosine
    similarities; all of them in their order, and no scores, when there are at most `k`."""
    _positive("k", k)
    items = criteria_items(criteria)
    labels = [label for label, _ in items]
    if k >= len(items):
        return labels, None
    texts = [query_text(state, instructions)] + [option_text(label, d) for label, d in items]
    vectors = _matrix(embed_fn(texts), len(texts)).astype(np.float64)
    sims = cosine(vectors[0], vectors[1:])
    order = np.argsort(-sims, kind="mergesort")[:k]  # stable: ties keep the earlier option
    return [labels[i] for i in order], [float(sims[i]) for i in order]


def cosine(query: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Signed cosine similarity of each row of `docs` to `query` (0 where either is a zero vector)."""
    sims = np.zeros(len(docs), dtype=np.float64)
    norm = float(np.linalg.norm(query))
    if norm == 0.0 or not len(docs):
        return sims
    denominators = np.linalg.norm(docs, axis=1) * norm
    ok = denominators > 0
    sims[ok] = np.clip(docs[ok] @ query / denominators[ok], -1.0, 1.0)
    return sims


def shortlisted(question: Mapping[str, Any], labels: list[str]) -> dict[str, Any]:
    """The question with only `labels` among its options, in that (rank) order."""
    criteria = question["criteria"]
    kept = {label: dict(criteria)[label] for label in labels} if isinstance(criteria, Mapping) else list(labels)
    return {**question, "criteria": kept}


def model_embedder(model: Any) -> EmbedFn:
    """The model's own cached embedder, made at its first shortlist and kept as long as the model."""
    with _EMBEDDERS_LOCK:
        found = _EMBEDDERS.get(model)
        if found is None:
            found = _EMBEDDERS[model] = cached_embed_fn(embed_fn_from_model(model))
        return found


def predict_shortlist(model: Any, state: Any, questions: Mapping[str, Any], embed_fn: EmbedFn | None = None,
                      k: int = DEFAULT_K, **predict_kwargs: Any) -> dict[str, Any]:
    """`model.predict` with every choice of more than `k` options narrowed to its `k` nearest (by
    `embed_fn`, default the model's own encoder); the answer's `shortlist` says, per narrowed question,
    the kept labels (best first), their scores, `k`, the number of options `n`, and whether the
    question went through whole (`passthrough`). Other questions are asked as given."""
    if not isinstance(questions, Mapping):
        raise TypeError(f"questions must be a dict, got {type(questions).__name__}")
    _positive("k", k)
    embed = embed_fn or model_embedder(model)
    reduced: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for qid, question in questions.items():
        if not isinstance(question, Mapping) or question.get("type") != "choice":
            reduced[qid] = question
            continue
        if "criteria" not in question:
            raise ValueError(f"question {qid!r} is a choice but has no criteria")
        labels, scores = shortlist_choice(state, question["criteria"], embed, k,
                                          instructions=question.get("instructions"))
        n = len(criteria_items(question["criteria"]))
        meta[qid] = {"labels": labels, "scores": scores, "k": k, "n": n, "passthrough": scores is None}
        reduced[qid] = question if scores is None else shortlisted(question, labels)
    return {**model.predict(state, reduced, **predict_kwargs), "shortlist": meta}


Kept = dict[str, tuple[dict[str, Any], tuple[str, ...]]]  # qid -> (what the answer reports, the options asked)


def shortlist_request(model: Any, request: Request) -> tuple[Request, Kept]:
    """The request with every `x_shortlist` choice narrowed to its K options nearest the state (best
    first), and per narrowed question what the answer reports (`x_shortlist`) with its options as
    asked (the answer lists them all, the eliminated at 0). One state per request: a shortlist is the
    state's own."""
    narrowed = [q for q in request.questions if q.shortlist is not None and q.shortlist < q.n_options]
    if not narrowed:
        return request, {}
    if len(request.states) != 1:
        raise QuestionError("x_shortlist narrows a choice to the options nearest one state; send the states one "
                            "request each", qid=narrowed[0].qid, error_type="invalid_shortlist")
    embed, state = model_embedder(model), request.states[0]
    kept: Kept = {}
    questions = []
    for q in request.questions:
        if q not in narrowed:
            questions.append(q)
            continue
        labels, scores = shortlist_choice(state, dict(zip(q.names, q.descriptions)), embed, q.shortlist or 0,
                                          instructions=q.instructions)
        questions.append(reordered(q, [q.names.index(label) for label in labels]))
        kept[q.qid] = ({"kept": labels, "scores": scores, "k": q.shortlist, "n": q.n_options}, q.keys)
    return replace(request, questions=tuple(questions)), kept


def widened(answer: Answer, report: dict[str, Any], keys: Sequence[str]) -> Answer:
    """A shortlisted choice's answer over every option asked (the eliminated at probability 0, in the
    order asked, as the contract wants), its confidence over them all, and `x_shortlist`."""
    given = answer.probabilities or {}
    probabilities = {key: float(given.get(key, 0.0)) for key in keys}
    return replace(answer, probabilities=probabilities, confidence=choice_confidence(list(probabilities.values())),
                   extras={**answer.extras, "x_shortlist": report})
