"""Chat completions and completions as the official `openai` client reads them: whole (`whole_body`), or
streamed as server-sent events (`stream_events`).

The headers and the role chunk go out at once; while the prompt is read, sse-starlette sends
": keep-alive" comments (app/serve/http.py). Text arrives as the engine decodes it. Where the model
may answer with tool calls, content is shown up to the start of a `<tool_call>` tag (or of what may
be one) and the rest waits for the end: then the calls go out as `delta.tool_calls` chunks (one per
call, whole) with finish_reason "tool_calls", or, where the answer holds no call that parses, the rest
of it as content.
"""

from __future__ import annotations

import json

from kvgraft.app.core.jobs import Cancelled, Errored, Returned, Yielded
from kvgraft.app.serve import openai_api as api
from kvgraft.app.serve import tools
from kvgraft.app.serve.api_errors import ApiError
from kvgraft.app.serve.worker import Text


def timings(prep, done: dict) -> dict:
    return {
        "prompt_n": prep.tokens_prefilled,
        "cache_n": prep.cached_tokens,
        "prompt_ms": prep.prefill_ms + prep.graft_ms,
        "predicted_n": done["completion_tokens"],
        "predicted_ms": done["decode_ms"],
    }


def engine_error(ev: Errored | Cancelled) -> ApiError:
    """What an ending that is not an answer becomes (app/core/jobs.py's events)."""
    if isinstance(ev, Cancelled):
        return ApiError(408, "the request ran past its time limit", code="timeout")
    code, message = ev.code, ev.message
    if code == "internal":  # a bug: its type for the log reader, never its words (nor a traceback) to a client
        return ApiError(500, f"internal error ({ev.kind})", "server_error", code="engine_error")
    if code == "context_length_exceeded":
        return ApiError(400, message, code=code)
    if code == "shutting_down":
        return ApiError(503, message, "unavailable_error", code=code)
    return ApiError(500, message, "server_error", code=code)


def whole_body(server, req, done: dict, prep) -> dict:
    """A chat completion or a completion, whole."""
    model = server.worker.service.engine.model
    reason = api.finish_reason(done["stop_reason"])
    if req.chat:
        parsed = tools.parse_answer(done["text"], req.tools, cut=api.finish_reason(done["stop_reason"]) == "length")
        message = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            message["tool_calls"], reason = parsed.calls, "tool_calls"
        choice = {
            "index": 0,
            "message": message,
            "logprobs": api.chat_logprobs(model, done["logprobs"]) if req.top_logprobs is not None else None,
            "finish_reason": reason,
        }
    else:
        choice = {
            "index": 0,
            "text": done["text"],
            "logprobs": api.completion_logprobs(model, done["logprobs"]) if req.top_logprobs is not None else None,
            "finish_reason": reason,
        }
    return {
        "id": api.new_id("chatcmpl" if req.chat else "cmpl"),
        "object": "chat.completion" if req.chat else "text_completion",
        "created": api.created(),
        "model": server.model_id,
        "choices": [choice],
        "usage": api.usage(prep.prompt_tokens, done["completion_tokens"], prep.cached_tokens),
        "timings": timings(prep, done),
        "kvgraft": {**prep.as_dict(), "constraint": done.get("constraint")},
    }


async def stream_events(server, req, job, events):
    """The events of one streamed request (`server`: app/serve/http.py's Server)."""
    model = server.worker.service.engine.model
    ident, made = api.new_id("chatcmpl" if req.chat else "cmpl"), api.created()
    obj = "chat.completion.chunk" if req.chat else "text_completion"
    head = {"id": ident, "object": obj, "created": made, "model": server.model_id}

    def chunk(delta, lps, reason=None) -> dict:
        if req.chat:
            d = {"content": delta} if isinstance(delta, str) else (delta or {})
            lp = api.chat_logprobs(model, lps) if req.top_logprobs is not None and lps else None
            choice = {"index": 0, "delta": d, "logprobs": lp, "finish_reason": reason}
        else:
            lp = api.completion_logprobs(model, lps) if req.top_logprobs is not None and lps else None
            choice = {"index": 0, "text": delta or "", "logprobs": lp, "finish_reason": reason}
        return {"data": json.dumps({**head, "choices": [choice]})}

    hold = req.chat and req.tools.active  # the answer may be calls: content stops at a call's tag
    text, shown, waiting = "", "", []
    prep = None
    try:
        if req.chat:
            yield chunk({"role": "assistant", "content": ""}, [])
        while True:
            ev = await events.get()
            if isinstance(ev, Yielded) and not isinstance(ev.value, Text):
                prep = ev.value
            elif isinstance(ev, Yielded):
                piece, lps = ev.value.piece, ev.value.logprobs
                if not hold:
                    if piece or lps:
                        yield chunk(piece, lps)
                    continue
                text, waiting = text + piece, waiting + lps
                cut = tools.held_back(text)
                if cut > len(shown):
                    yield chunk(text[len(shown) : cut], waiting)
                    shown, waiting = text[:cut], []
            elif isinstance(ev, (Errored, Cancelled)):
                yield {"data": json.dumps(engine_error(ev).body())}
                break
            elif isinstance(ev, Returned):
                done = ev.value
                server.metrics.decoded(done["completion_tokens"])
                reason = api.finish_reason(done["stop_reason"])
                tail = waiting + done["tail_logprobs"]
                if hold:
                    parsed = tools.parse_answer(
                        done["text"], req.tools, cut=api.finish_reason(done["stop_reason"]) == "length"
                    )
                    if parsed.calls:
                        for i, call in enumerate(parsed.calls):
                            yield chunk({"tool_calls": [{"index": i, **call}]}, [])
                        reason = "tool_calls"
                    elif len(done["text"]) > len(shown):
                        yield chunk(done["text"][len(shown) :], [])
                yield chunk(None, tail, reason)
                if req.include_usage and prep is not None:
                    usage = api.usage(prep.prompt_tokens, done["completion_tokens"], prep.cached_tokens)
                    last = {**head, "choices": [], "usage": usage, "timings": timings(prep, done)}
                    kv = {**prep.as_dict(), "constraint": done.get("constraint")}
                    yield {"data": json.dumps({**last, "kvgraft": kv})}
                break
        yield {"data": "[DONE]"}
    finally:
        job.cancel.set()  # a client gone mid-stream: the engine stops at the next token
