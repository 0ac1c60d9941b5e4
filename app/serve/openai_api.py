"""The OpenAI API's request fields and response shapes, checked in Python before anything is queued.

A request is parsed into a `CompletionRequest` or refused with an `ApiError` naming the field (a 400;
the official `openai` client reads `{"error": {"message", "type", "param", "code"}}`). Unknown fields
are ignored, as the other local servers do; `n` other than 1, tools and images are refused by name.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from kvgraft.engine.sampling import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob

ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 4


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass
class CompletionRequest:
    chat: bool
    model: str | None
    messages: list[dict] = field(default_factory=list)  # chat: {"role", "content": str}
    prompt: str = ""  # completions
    max_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    top_logprobs: int | None = None  # None: no logprobs; 0..20 with them
    echo: bool = False


def _int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        span = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise bad(name, f"'{name}' must be an integer {span}, got {str(v)[:40]!r}")
    return v


def _number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
        raise bad(name, f"'{name}' must be a number between {lo} and {hi}, got {str(v)[:40]!r}")
    return float(v)


def _content(msg: dict, i: int) -> str:
    c = msg.get("content")
    if c is None and msg.get("role") == "assistant":
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for part in c:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(
                    f"messages[{i}].content",
                    f"messages[{i}].content: only text parts are supported, got {str(kind)[:40]!r}",
                    "unsupported_content",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"messages[{i}].content", f"messages[{i}].content must be a string or a list of text parts")


def parse_request(body, chat: bool) -> CompletionRequest:
    if not isinstance(body, dict):
        raise bad(None, "the request body must be a JSON object")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad("n", "'n' other than 1 is not supported: one choice per request", "unsupported_parameter")
    for unsupported in ("tools", "functions", "tool_choice", "function_call"):
        if body.get(unsupported):
            raise bad(unsupported, f"'{unsupported}' is not supported by this server", "unsupported_parameter")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", "'model' must be a string")
    req = CompletionRequest(chat=chat, model=model)
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise bad("messages", "'messages' must be a non-empty list of {role, content} objects")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES:
                role = m.get("role") if isinstance(m, dict) else None
                raise bad(f"messages[{i}].role", f"messages[{i}].role must be one of {ROLES}, got {str(role)[:40]!r}")
            role = "system" if m["role"] == "developer" else m["role"]
            req.messages.append({"role": role, "content": _content(m, i)})
        if req.messages[-1]["role"] == "assistant":
            raise bad("messages", "the last message must not be the assistant's: there is nothing to answer")
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise bad("prompt", "'prompt' must be a non-empty string (one prompt per request)")
        req.prompt = prompt
        req.echo = bool(body.get("echo", False))
        if req.echo:
            raise bad("echo", "'echo' is not supported", "unsupported_parameter")
    mt = _int(body, "max_completion_tokens", 1) if chat else None
    req.max_tokens = mt if mt is not None else _int(body, "max_tokens", 1)
    # the default here is 0 (greedy), not OpenAI's 1: the same request gives the same answer
    temperature = _number(body, "temperature", 0.0, 2.0, 0.0)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if top_p == 0.0:
        raise bad("top_p", "'top_p' must be greater than 0")
    seed = _int(body, "seed", -(2**63), 2**64 - 1)
    req.sampling = SamplingParams(temperature=temperature, top_p=top_p, seed=None if seed is None else seed % 2**63)
    stop = body.get("stop")
    if stop is None:
        stops: list = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOPS:
        stops = stop
    else:
        raise bad("stop", f"'stop' must be a string or a list of at most {MAX_STOPS} strings")
    req.stop = tuple(s for s in stops if s)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "'stream' must be true or false")
    req.stream = stream
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad("stream_options", "'stream_options' must be an object")
        req.include_usage = bool(opts.get("include_usage", False))
    if chat:
        if body.get("logprobs"):
            top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
            req.top_logprobs = top or 0
        elif body.get("top_logprobs") is not None:
            raise bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    else:
        lp = _int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
        req.top_logprobs = lp
    return req


# -- responses -----------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(stop_reason: str) -> str:
    return "stop" if stop_reason == "eog" or stop_reason.startswith("stop:") else "length"


def chat_logprobs(model, lps: list[TokenLogprob]) -> dict:
    def one(tok: int, lp: float) -> dict:
        b = model.token_bytes(tok)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

    return {
        "content": [{**one(x.token, x.logprob), "top_logprobs": [one(t, v) for t, v in x.top]} for x in lps],
        "refusal": None,
    }


def completion_logprobs(model, lps: list[TokenLogprob], offset0: int = 0) -> dict:
    tokens, values, tops, offsets = [], [], [], []
    at = offset0
    for x in lps:
        text = model.token_bytes(x.token).decode("utf-8", errors="replace")
        tokens.append(text)
        values.append(x.logprob)
        tops.append({model.token_bytes(t).decode("utf-8", errors="replace"): v for t, v in x.top})
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def created() -> int:
    return int(time.time())
