"""Anthropic's Messages API (`POST /v1/messages`) over the one request core: shapes only.

A Messages body is translated into the chat completions body it means and parsed by the same checks
(app/serve/openai_api.py, app/serve/tools.py); the answer goes back as a Messages response, whole or
as Anthropic's stream events (`message_start`, `content_block_start`, `content_block_delta`,
`content_block_stop`, `message_delta`, `message_stop`). Errors are Anthropic's shape:
`{"type": "error", "error": {"type", "message"}}`.

    system                  a string or text blocks            -> a system message
    messages[].content      a string or blocks: text, tool_use (assistant), tool_result (user)
    tools[]                 {name, description, input_schema}  -> function tools
    tool_choice             auto / any / tool {name} / none    -> auto / required / named / none
    max_tokens              required, as Anthropic requires it
    stop_sequences, temperature (0..1), top_p, top_k, stream, metadata (ignored)

`cache_control` on a block pins the prefix up to the end of the message holding it (a system block: the
system prompt) by name, kept across restarts past the cache budget for its time to live (library/
cache_pins.py). Usage reports `cache_read_input_tokens` (the prompt tokens grafted or still warm) and
`cache_creation_input_tokens` (the tokens of a pin this request stores for the first time).
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from kvgraft.app.core.jobs import Cancelled, Errored, Returned, Yielded
from kvgraft.app.serve import openai_api as api
from kvgraft.app.serve import tools
from kvgraft.app.serve.api_errors import ApiError, bad
from kvgraft.app.serve.openai_shapes import engine_error
from kvgraft.app.serve.worker import Text

STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error(exc: ApiError) -> JSONResponse:
    kind = ERROR_TYPES.get(exc.status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


# -- the request ---------------------------------------------------------------------------------
def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, b in enumerate(content):
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                kind = b.get("type") if isinstance(b, dict) else type(b).__name__
                raise bad(f"{where}[{j}]", f"{where}[{j}]: only text blocks are supported here, got {str(kind)[:40]!r}")
            out.append(b["text"])
        return "".join(out)
    raise bad(where, f"{where} must be a string or a list of text blocks")


def _messages(msgs) -> list[dict]:
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "'messages' must be a non-empty list of {role, content} objects")
    out: list[dict] = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad(f"{where}.role", f"{where}.role must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"{where}.content", f"{where}.content must be a string or a list of blocks")
        text, calls = [], []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            at = f"{where}.content[{j}]"
            if kind == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    raise bad(at, f"{at}: a tool_use block needs a name and an input object")
                call = {"name": b["name"], "arguments": json.dumps(b.get("input", {}))}
                calls.append({"id": str(b.get("id") or f"toolu_{i}_{j}"), "type": "function", "function": call})
            elif kind == "tool_result" and m["role"] == "user":
                result = b.get("content", "")
                body = _text(result, f"{at}.content") if result else ""
                if b.get("is_error"):
                    body = f"(error) {body}"
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": body})
            else:
                raise bad(at, f"{at}: unsupported block {str(kind)[:40]!r} in a {m['role']} message")
        if text or calls or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            msg = {"role": m["role"], "content": "".join(text) or (None if calls else "")}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        pin = next((b["cache_control"] for b in content if isinstance(b, dict) and b.get("cache_control")), None)
        if pin is not None and out:  # the prefix up to the end of this message is pinned
            out[-1]["cache_control"] = pin
    return out


def _tool_choice(tc):
    if tc is None:
        return None, None
    kind = tc.get("type") if isinstance(tc, dict) else None
    parallel = None
    if isinstance(tc, dict) and "disable_parallel_tool_use" in tc:
        parallel = not tc["disable_parallel_tool_use"]
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}, parallel
    raise bad("tool_choice", "'tool_choice' must be {type: auto}, {type: any}, {type: tool, name} or {type: none}")


def parse(body) -> api.CompletionRequest:
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise bad("max_tokens", "'max_tokens' is required: an integer of at least 1")
    chat: dict = {"model": body.get("model"), "max_tokens": body["max_tokens"], "stream": body.get("stream", False)}
    system = body.get("system")
    msgs = [{"role": "system", "content": _text(system, "system")}] if system else []
    if isinstance(system, list):
        pin = next((b["cache_control"] for b in system if isinstance(b, dict) and b.get("cache_control")), None)
        if pin is not None:
            msgs[0]["cache_control"] = pin
    chat["messages"] = msgs + _messages(body.get("messages"))
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    t = body.get("temperature")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 1:
        raise bad("temperature", "'temperature' must be between 0 and 1")
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    if body.get("tools") is not None:
        chat["tools"] = tools.as_chat_tools(body["tools"], "input_schema", typed=False)
    choice, parallel = _tool_choice(body.get("tool_choice"))
    if choice is not None:
        chat["tool_choice"] = choice
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    return api.parse_request(chat, chat=True)


# -- the answer ----------------------------------------------------------------------------------
def _blocks(req, done: dict) -> tuple[list[dict], str, str | None]:
    parsed = tools.parse_answer(done["text"], req.tools, cut=api.finish_reason(done["stop_reason"]) == "length")
    blocks = [{"type": "text", "text": parsed.content}] if parsed.content else []
    for c in parsed.calls:
        use_id = "toolu_" + c["id"][len("call_") :]
        blocks.append(
            {
                "type": "tool_use",
                "id": use_id,
                "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"]),
            }
        )
    reason = api.finish_reason(done["stop_reason"])
    if parsed.calls:
        reason = "tool_calls"
    stop_seq = None
    if done["stop_reason"].startswith("stop:") and done["stop_reason"][5:] in req.stop:
        reason, stop_seq = "stop_sequence", done["stop_reason"][5:]
    return blocks, STOP_REASONS.get(reason, "end_turn" if reason == "stop" else reason), stop_seq


def _usage(prep, done: dict | None) -> dict:
    created = max((p["n_tokens"] for p in prep.pins if p["state"] == "pending"), default=0)
    return {
        "input_tokens": prep.prompt_tokens - prep.cached_tokens,
        "cache_read_input_tokens": prep.cached_tokens,
        "cache_creation_input_tokens": created,
        "output_tokens": done["completion_tokens"] if done else 0,
    }


def whole(server, req, done: dict, prep) -> dict:
    blocks, reason, stop_seq = _blocks(req, done)
    return {
        "id": api.new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": server.model_id,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": stop_seq,
        "usage": _usage(prep, done),
        "kvgraft": {**prep.as_dict(), "constraint": done.get("constraint")},
    }


def _event(kind: str, **data) -> dict:
    return {"event": kind, "data": json.dumps({"type": kind, **data})}


async def stream(server, req, job, events):
    """Anthropic's stream: text deltas as they are decoded (up to a call's tag), tool_use blocks whole."""
    ident = api.new_id("msg")
    text, shown, index, prep, open_text = "", "", 0, None, False
    try:
        while True:
            ev = await events.get()
            if isinstance(ev, Yielded) and not isinstance(ev.value, Text):
                prep = ev.value
                message = {"id": ident, "type": "message", "role": "assistant", "model": server.model_id, "content": []}
                yield _event(
                    "message_start",
                    message={**message, "stop_reason": None, "stop_sequence": None, "usage": _usage(prep, None)},
                )
            elif isinstance(ev, Yielded):
                text += ev.value.piece
                cut = tools.held_back(text) if req.tools.active else len(text)
                if cut > len(shown):
                    if not open_text:
                        yield _event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                        open_text = True
                    yield _event(
                        "content_block_delta", index=index, delta={"type": "text_delta", "text": text[len(shown) : cut]}
                    )
                    shown = text[:cut]
            elif isinstance(ev, (Errored, Cancelled)):
                exc = engine_error(ev)
                yield _event("error", error={"type": ERROR_TYPES.get(exc.status, "api_error"), "message": exc.message})
                return
            elif isinstance(ev, Returned):
                done = ev.value
                server.metrics.decoded(done["completion_tokens"])
                blocks, reason, stop_seq = _blocks(req, done)
                calls = [b for b in blocks if b["type"] == "tool_use"]
                if not calls and len(done["text"]) > len(shown):  # the held-back rest, as text
                    if not open_text:
                        yield _event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                        open_text = True
                    yield _event(
                        "content_block_delta",
                        index=index,
                        delta={"type": "text_delta", "text": done["text"][len(shown) :]},
                    )
                if open_text:
                    yield _event("content_block_stop", index=index)
                    index += 1
                for b in calls:
                    yield _event("content_block_start", index=index, content_block={**b, "input": {}})
                    yield _event(
                        "content_block_delta",
                        index=index,
                        delta={"type": "input_json_delta", "partial_json": json.dumps(b["input"])},
                    )
                    yield _event("content_block_stop", index=index)
                    index += 1
                yield _event(
                    "message_delta",
                    delta={"stop_reason": reason, "stop_sequence": stop_seq},
                    usage={"output_tokens": done["completion_tokens"]},
                )
                yield _event("message_stop")
                return
    finally:
        job.cancel.set()
