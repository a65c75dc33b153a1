"""`POST /v1/chat/completions`: typed structured output for the OpenAI clients every application has.

A laya model decides, it does not write: this route answers a chat completion whose
`response_format` is a `json_schema` with the object that schema's fields decide (planned as
`laya.structured` plans them: enums, booleans, bounded integers), read from the conversation as the
state (its turns as `{"role", "content"}`, the newest kept when it is long). The message content is
that object as JSON, so `client.chat.completions.parse(..., response_format=Model)` gives a typed
value; `x_laya` beside it carries each field's probabilities, confidence and raw answer.

What is not a decision is refused up front with OpenAI's error shape (which the clients surface):
text or `json_object` formats, streaming, several choices, tools, images. The request goes through the
same admission, limits, deadline and engines as `/v1/systemone`; `x_min_confidence` (a number or a
bucket map) turns low-confidence fields into null, as `decide(min_confidence=)` does.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from laya.api import MAX_ERROR_TEXT, ApiError
from laya.errors import QuestionError
from laya.request import Request, check_size, parse_request
from laya.server.call import Call, Reply
from laya.structured import Field, check_min_confidence, details, plan_schema, questions_of
from laya.structured.gate import Threshold
from laya.structured.values import settle

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_MESSAGES = 1024


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion that asks for a decision: the served name, the fields, the validated request."""

    model: str | None
    schema_name: str
    fields: list[Field]
    request: Request | None  # None: every field has one possible value (nothing to read)
    min_confidence: Threshold | None


def refusal(status: int, message: str, param: str | None = None, code: str = "invalid_request_error") -> ApiError:
    return ApiError(status, {"message": message[:MAX_ERROR_TEXT], "type": code, "param": param, "code": None})


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise refusal(400, f"messages[{i}].content: laya reads text only; a content part must be "
                                   '{"type": "text", "text": "..."}', f"messages[{i}].content")
            texts.append(part["text"])
        return "\n".join(texts)
    raise refusal(400, f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def conversation(messages: Any) -> list[dict[str, str]]:
    """The state: each turn's role and text, in order."""
    if not isinstance(messages, list) or not messages:
        raise refusal(400, "messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > MAX_MESSAGES:
        raise refusal(413, f"the request has {len(messages)} messages; this server reads at most {MAX_MESSAGES}",
                      "messages")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise refusal(400, f"messages[{i}] must be an object with a role ({', '.join(ROLES)})", f"messages[{i}]")
        if message.get("tool_calls"):
            raise refusal(400, f"messages[{i}]: tool calls are not read; a decision reads text turns",
                          f"messages[{i}].tool_calls")
        turns.append({"role": message["role"], "content": _content(message, i)})
    return turns


def parse_chat(body: Any, limits: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise refusal(400, "the body must be a JSON object")
    if body.get("stream"):
        raise refusal(400, "stream is not supported: a decision is one object, answered whole", "stream")
    n = body.get("n", 1)
    if n not in (None, 1) or isinstance(n, bool):
        raise refusal(400, "n must be 1: a decision has one answer (its probabilities are in x_laya)", "n")
    for key in ("tools", "functions", "tool_choice", "function_call", "logprobs", "top_logprobs", "audio",
                "prediction"):
        if body.get(key) not in (None, False, [], "none"):
            raise refusal(400, f"{key} is not supported: laya answers a response_format json_schema only", key)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise refusal(400, "model must be a string", "model")
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise refusal(400, "response_format must be {\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., "
                           "\"schema\": {...}}}: a laya model decides the fields of a schema (enums, booleans, "
                           "bounded integers) and does not write free text", "response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise refusal(400, "response_format.json_schema must be an object with a schema", "response_format.json_schema")
    given = spec.get("name")
    name = given if isinstance(given, str) else "decision"
    try:
        threshold = check_min_confidence(body.get("x_min_confidence"))
        fields = plan_schema(spec["schema"])
    except QuestionError as exc:
        raise refusal(400, str(exc), "response_format.json_schema.schema"
                      if exc.error_type == "invalid_schema" else "x_min_confidence") from exc
    state = conversation(body.get("messages"))
    asked = questions_of([f for f in fields if not f.certain])  # a const or one-value enum is filled, not asked
    request = None
    if asked:
        inner = {"state": state, "questions": asked}
        try:
            check_size(inner, False, limits)
            request = replace(parse_request(inner, limits=limits, sized=True), model=model)
        except ApiError as exc:
            raise refusal(exc.status, _first_message(exc.detail), "response_format.json_schema.schema") from exc
    return ChatRequest(model, name[:64], fields, request, threshold)


def _first_message(detail: Any) -> str:
    if isinstance(detail, list) and detail:
        item = detail[0]
        return f"{'.'.join(str(x) for x in item.get('loc', [])[1:])}: {item.get('msg')}"
    if isinstance(detail, dict):
        return str(detail.get("message", detail))
    return str(detail)


def as_openai_error(exc: ApiError) -> ApiError:
    """An error of the shared path (admission, limits, deadline, engines) in OpenAI's shape."""
    detail = exc.detail
    if isinstance(detail, dict) and "type" in detail and "param" in detail:
        return exc
    kind = detail.get("error_type", "invalid_request_error") if isinstance(detail, dict) else "invalid_request_error"
    return ApiError(exc.status, {"message": _first_message(detail)[:MAX_ERROR_TEXT], "type": kind, "param": None,
                                 "code": None}, exc.headers)


async def chat_completions(request: Call) -> Reply:
    """A chat completion answered by deciding its response_format's schema from the conversation."""
    ctx = request.app.state.context
    try:
        ctx.check_auth(request, missing=401)
        chat = await ctx.read_body(request, lambda body: body, lambda body: parse_chat(body, ctx.config.limits))
        if chat.request is not None:
            name, (result,) = await ctx.answer_as(request, chat.request)
            response, tokens = result.to_json(), result.input_tokens
        else:  # every field has one possible value: no forward pass
            name, tokens = ctx.resolve(chat.model), 0
            response = {"model": name, "answers": {}, "usage": {"input_tokens": 0, "output_tokens": 0}}
    except ApiError as exc:
        failed = as_openai_error(exc)
        return Reply({"error": failed.detail}, failed.status, failed.headers)
    values = settle(response, chat.fields, chat.min_confidence)
    decided = details(values, response)
    created = int(time.time())
    body = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": created, "model": name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": json.dumps(values, ensure_ascii=False),
                                             "refusal": None},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
        "x_laya": {"schema": chat.schema_name, "probabilities": decided.probabilities,
                   "confidence": decided.confidence, "answer_confidence": decided.answer_confidence,
                   "answers": decided.answers,
                   **{k: response[k] for k in ("x_usage", "x_routed_to", "x_route_reason", "x_precision")
                      if k in response}},
    }
    return Reply(body)
