"""The OpenAI API's request fields and response shapes, checked in Python before anything is queued.

A request is parsed into a `CompletionRequest` or refused with an `ApiError` naming the field (a 400;
the official `openai` client reads `{"error": {"message", "type", "param", "code"}}`). Unknown fields
are ignored, as the other local servers do; a known field this server does not apply (`n` other than 1,
`logit_bias`, llama-server's samplers other than top-k, min-p and the penalties, images) is refused by
name, never accepted and ignored. Tools and
`response_format` are parsed by app/serve/tools.py. A chat whose last message is the assistant's is a
reply to continue (a prefilled start): the answer is what follows it.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field

from kvgraft.app.serve.api_errors import ApiError, bad
from kvgraft.app.serve.tools import ToolSpec, parse_tools
from kvgraft.engine.sampling import DEFAULT_LAST_N, MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob
from kvgraft.library.cache_pins import DEFAULT_TTL_S, MAX_TTL_S

__all__ = ["ApiError", "bad", "CompletionRequest", "parse_request"]

ROLES = ("system", "developer", "user", "assistant", "tool")
# known sampling fields (OpenAI's, llama-server's) this server does not apply: refused unless they ask for nothing
REFUSED = {
    "logit_bias": {},
    "typical_p": 1,
    "mirostat": 0,
    "tfs_z": 1,
    "dry_multiplier": 0,
    "xtc_probability": 0,
    "dynatemp_range": 0,
    "top_n_sigma": -1,
}
MAX_STOPS = 4


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
    tools: ToolSpec = field(default_factory=ToolSpec)  # tools, tool_choice, response_format
    prefill: str | None = None  # the start of the reply (a last assistant message) to continue
    extra: dict = field(default_factory=dict)  # what a surface (app/serve/responses_api.py) keeps for its answer


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


def _ttl(cc, where: str) -> float:
    """A `cache_control` object's time to live in seconds ({"type": "ephemeral", "ttl": "5m" | "1h" | ...})."""
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise bad(where, f"{where} must be {{type: ephemeral}} (with an optional ttl such as '1h')")
    ttl = cc.get("ttl")
    if ttl is None:
        return DEFAULT_TTL_S
    m = re.fullmatch(r"(\d{1,7})([smhd])", ttl) if isinstance(ttl, str) else None
    seconds = int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)] if m else 0
    if not 0 < seconds <= MAX_TTL_S:
        raise bad(f"{where}.ttl", f"{where}.ttl must be a duration such as '5m', '1h' or '7d' (at most 30 days)")
    return seconds


def _pins(msg: dict, i: int) -> list:
    """The pins a message asks for: `cache_control` on it or on one of its content parts (the prefix up to
    the end of this message; named by its tokens when the request is tokenized)."""
    out = []
    if msg.get("cache_control") is not None:
        out.append((None, _ttl(msg["cache_control"], f"messages[{i}].cache_control")))
    if isinstance(msg.get("content"), list):
        for j, part in enumerate(msg["content"]):
            if isinstance(part, dict) and part.get("cache_control") is not None:
                out.append((None, _ttl(part["cache_control"], f"messages[{i}].content[{j}].cache_control")))
    return out


def _content(msg: dict, i: int) -> str:
    c = msg.get("content")
    if c is None and msg.get("role") in ("assistant", "tool"):
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
    for name, nothing in REFUSED.items():
        if body.get(name) is not None and body.get(name) != nothing:
            raise bad(name, f"'{name}' is not supported by this server (only {nothing!r})", "unsupported_parameter")
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
            msg = {"role": role, "content": _content(m, i)}
            if role == "assistant" and m.get("tool_calls"):
                msg["tool_calls"] = _tool_calls(m["tool_calls"], i)
            if pins := _pins(m, i):
                msg["_pins"] = pins
            req.messages.append(msg)
        key = body.get("prompt_cache_key")
        if key is not None:
            if not isinstance(key, str) or not 0 < len(key) <= 200:
                raise bad("prompt_cache_key", "'prompt_cache_key' must be a string of 1 to 200 characters")
            last_user = max((k for k, m in enumerate(req.messages) if m["role"] == "user"), default=0)
            if last_user > 0:  # the prefix up to the end of the last message before the final user turn
                req.messages[last_user - 1].setdefault("_pins", []).append((key, DEFAULT_TTL_S))
        req.tools = parse_tools(body)
        last = req.messages[-1]
        if last["role"] == "assistant":
            if last.get("tool_calls"):
                raise bad("messages", "the last message is the assistant's calls: send the tools' results after it")
            if len(req.messages) == 1:
                raise bad("messages", "there is nothing before the assistant's message to answer")
            req.prefill = last["content"]
            if req.tools.active or req.tools.constrained:
                raise bad(
                    "messages",
                    "a prefilled reply (a last assistant message) cannot be combined with tools or response_format",
                )
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise bad("prompt", "'prompt' must be a non-empty string (one prompt per request)")
        req.prompt = prompt
        req.tools = parse_tools(body)
        if req.tools.tools:
            raise bad("tools", "'tools' needs /v1/chat/completions", "unsupported_parameter")
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
    req.sampling = sampling_params(body, temperature, top_p, None if seed is None else seed % 2**63)
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


def sampling_params(body: dict, temperature: float, top_p: float, seed: int | None) -> SamplingParams:
    """The sampler's fields, with llama.cpp's names and meanings (engine/sampling.py)."""
    top_k = _int(body, "top_k", -1)
    last_n = _int(body, "repeat_last_n", -1, 1 << 20)
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        top_k=max(top_k or 0, 0),  # llama.cpp: 0 or less is every token
        min_p=_number(body, "min_p", 0.0, 1.0, 0.0),
        repeat_penalty=_positive(body, "repeat_penalty", 10.0, 1.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
        repeat_last_n=DEFAULT_LAST_N if last_n is None else last_n,
    )


def _positive(body: dict, name: str, hi: float, default: float) -> float:
    v = _number(body, name, 0.0, hi, default)
    if v == 0:
        raise bad(name, f"'{name}' must be greater than 0 (1 is none)")
    return v


def _tool_calls(calls, i: int) -> list[dict]:
    """An assistant message's earlier calls, their arguments parsed (a template renders them as JSON)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad(where, f"{where} must be a list")
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise bad(f"{where}[{j}]", f"{where}[{j}] must be {{id, type: function, function: {{name, arguments}}}}")
        args = f.get("arguments") or "{}"
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            raise bad(f"{where}[{j}].function.arguments", f"{where}[{j}].function.arguments is not JSON") from None
        if not isinstance(parsed, dict):
            raise bad(f"{where}[{j}].function.arguments", f"{where}[{j}].function.arguments must be a JSON object")
        out.append({"id": str(c.get("id") or f"call_{i}_{j}"), "name": f["name"], "arguments": parsed})
    return out


# -- responses -----------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(stop_reason: str) -> str:
    return "stop" if stop_reason in ("eog", "grammar") or stop_reason.startswith("stop:") else "length"


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
