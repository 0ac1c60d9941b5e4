"""OpenAI's Responses API (`POST /v1/responses`) over the one request core: shapes only.

A Responses body is translated into the chat completions body it means and parsed by the same checks:

    instructions            -> a system message first
    input                   a string (one user message) or items: messages (role and content, a string
                            or input_text / output_text parts), function_call, function_call_output
    tools[]                 {type: function, name, description, parameters}
    tool_choice, parallel_tool_calls, temperature, top_p, stream
    max_output_tokens       -> max_tokens
    text.format             text / json_object / json_schema {name, schema}  -> response_format
    previous_response_id    the stored conversation it ended, with this input after it
    store                   (default true) keep this conversation for a later previous_response_id

A stored response is a small JSON file in the data dir (`responses/<id>.json`): the conversation's
messages, this answer's included. A request that goes on from it renders the same conversation, so the
prompt cache grafts its state from the library (after a restart too) instead of prefilling it again.
The answer is the `output` items (`message` with `output_text`, `function_call`), whole or as the
stream events the official client reads (`response.created` ... `response.output_text.delta` ...
`response.completed`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path

from kvgraft.app.core.jobs import Cancelled, Errored, Returned, Yielded
from kvgraft.app.serve import openai_api as api
from kvgraft.app.serve import tools
from kvgraft.app.serve.api_errors import bad
from kvgraft.app.serve.openai_shapes import engine_error
from kvgraft.app.serve.worker import Text

RESPONSE_ID = re.compile(r"resp_[0-9a-f]{24}")
log = logging.getLogger(__name__)


def _dir(server) -> Path:
    return Path(server.worker.service.library.root) / "responses"


# -- the request ---------------------------------------------------------------------------------
def _content(c, where: str) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        out = []
        for j, p in enumerate(c):
            if not isinstance(p, dict) or p.get("type") not in ("input_text", "output_text", "text"):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise bad(f"{where}[{j}]", f"{where}[{j}]: only text parts are supported, got {str(kind)[:40]!r}")
            if not isinstance(p.get("text"), str):
                raise bad(f"{where}[{j}].text", f"{where}[{j}].text must be a string")
            out.append(p["text"])
        return "".join(out)
    raise bad(where, f"{where} must be a string or a list of text parts")


def _items(items) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad("input", "'input' must be a string or a non-empty list of items")
    out: list[dict] = []
    for i, it in enumerate(items):
        where = f"input[{i}]"
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message" and it.get("role") in ("user", "system", "developer", "assistant"):
            out.append({"role": it["role"], "content": _content(it.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not isinstance(it.get("name"), str) or not isinstance(it.get("arguments", "{}"), str):
                raise bad(where, f"{where}: a function_call needs a name and arguments (a JSON string)")
            call = {"id": str(it.get("call_id") or f"call_{i}"), "type": "function"}
            call["function"] = {"name": it["name"], "arguments": it.get("arguments") or "{}"}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant message
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = it.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": str(it.get("call_id", "")), "content": text})
        else:
            raise bad(
                where, f"{where}: unsupported item {str(kind)[:40]!r} (messages, function_call, function_call_output)"
            )
    return out


def _format(text) -> dict | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad("text.format", "'text.format' must be an object")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    return {"type": fmt.get("type")}


def load(server, rid) -> list[dict]:
    if not isinstance(rid, str) or not RESPONSE_ID.fullmatch(rid):
        raise bad("previous_response_id", f"{str(rid)[:40]!r} is not a response id")
    path = _dir(server) / f"{rid}.json"
    try:
        messages = json.loads(path.read_text(encoding="utf-8"))["messages"]
        if not isinstance(messages, list):
            raise ValueError(rid)
        return messages
    except (OSError, ValueError, KeyError, TypeError):
        raise bad("previous_response_id", f"no stored response {rid}", "not_found") from None


def parser(server):
    def parse(body) -> api.CompletionRequest:
        if not isinstance(body, dict):
            raise bad(None, "the request body must be a JSON object")
        history = load(server, body["previous_response_id"]) if body.get("previous_response_id") else []
        new = _items(body.get("input"))
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise bad("instructions", "'instructions' must be a string")
        system = [{"role": "system", "content": instructions}] if instructions else []
        history = [m for m in history if m["role"] != "system"]  # instructions are not carried over
        chat: dict = {
            "model": body.get("model"),
            "messages": system + history + new,
            "stream": body.get("stream", False),
        }
        for name in ("temperature", "top_p", "parallel_tool_calls", "tool_choice", "prompt_cache_key"):
            if body.get(name) is not None:
                chat[name] = body[name]
        tc = body.get("tool_choice")
        if isinstance(tc, dict) and tc.get("type") == "function" and "function" not in tc:
            chat["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        if body.get("tools") is not None:
            chat["tools"] = tools.as_chat_tools(body["tools"], "parameters", typed=True)
        rf = _format(body.get("text"))
        if rf is not None:
            chat["response_format"] = rf
        store = body.get("store", True)
        if not isinstance(store, bool):
            raise bad("store", "'store' must be true or false")
        req = api.parse_request(chat, chat=True)
        req.extra = {
            "messages": [m for m in chat["messages"] if m["role"] != "system"],
            "previous_response_id": body.get("previous_response_id"),
            "store": store,
            "instructions": instructions,
            "echo": {k: body.get(k) for k in ("tools", "tool_choice", "temperature", "top_p", "max_output_tokens")},
        }
        return req

    return parse


# -- the answer ----------------------------------------------------------------------------------
def _output(req, done: dict) -> list[dict]:
    parsed = tools.parse_answer(done["text"], req.tools, cut=api.finish_reason(done["stop_reason"]) == "length")
    out = []
    if parsed.content:
        part = {"type": "output_text", "text": parsed.content, "annotations": []}
        out.append(
            {"type": "message", "id": api.new_id("msg"), "status": "completed", "role": "assistant", "content": [part]}
        )
    for c in parsed.calls:
        f = c["function"]
        out.append(
            {
                "type": "function_call",
                "id": "fc_" + c["id"][5:],
                "call_id": c["id"],
                "name": f["name"],
                "arguments": f["arguments"],
                "status": "completed",
            }
        )
    return out


def _body(server, req, rid: str, output: list, status: str, prep, done: dict | None) -> dict:
    echo = req.extra["echo"]
    usage = None
    if done is not None:
        usage = {
            "input_tokens": prep.prompt_tokens,
            "input_tokens_details": {"cached_tokens": prep.cached_tokens},
            "output_tokens": done["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prep.prompt_tokens + done["completion_tokens"],
        }
    incomplete = (
        {"reason": "max_output_tokens"}
        if done is not None and done["stop_reason"] in ("max_tokens", "context_full")
        else None
    )
    return {
        "id": rid,
        "object": "response",
        "created_at": api.created(),
        "status": "incomplete" if incomplete else status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": req.extra["instructions"],
        "max_output_tokens": echo["max_output_tokens"],
        "model": server.model_id,
        "output": output,
        "parallel_tool_calls": req.tools.parallel,
        "previous_response_id": req.extra["previous_response_id"],
        "store": req.extra["store"],
        "temperature": echo["temperature"] if echo["temperature"] is not None else 0.0,
        "top_p": echo["top_p"] if echo["top_p"] is not None else 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": echo["tool_choice"] or "auto",
        "tools": echo["tools"] or [],
        "truncation": "disabled",
        "metadata": {},
        "usage": usage,
    }


def _store(server, req, rid: str, output: list) -> None:
    """This conversation, its answer included, for a later request's previous_response_id."""
    if not req.extra["store"]:
        return
    said = []
    for item in output:
        if item["type"] == "message":
            said.append({"role": "assistant", "content": item["content"][0]["text"]})
        else:
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if said and said[-1].get("tool_calls") is not None:
                said[-1]["tool_calls"].append(call)
            elif said:
                said[-1]["tool_calls"] = [call]
            else:
                said.append({"role": "assistant", "content": None, "tool_calls": [call]})
    folder = _dir(server)
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"messages": req.extra["messages"] + said}, fh)
        os.replace(tmp, folder / f"{rid}.json")  # whole or absent, never half-written
    except OSError as exc:  # the answer stands; a later previous_response_id to it is a 400
        log.warning("response %s was not stored: %s", rid, exc)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _new_id() -> str:
    return "resp_" + api.new_id("x")[2:]


def whole(server, req, done: dict, prep) -> dict:
    rid, output = _new_id(), _output(req, done)
    _store(server, req, rid, output)
    return {
        **_body(server, req, rid, output, "completed", prep, done),
        "kvgraft": {**prep.as_dict(), "constraint": done.get("constraint")},
    }


async def stream(server, req, job, events):
    rid = _new_id()
    seq = [0]

    def event(kind: str, **data) -> dict:
        seq[0] += 1
        return {"event": kind, "data": json.dumps({"type": kind, "sequence_number": seq[0] - 1, **data})}

    text, shown, prep, item_id, opened = "", "", None, api.new_id("msg"), False
    message = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
    head = _body(server, req, rid, [], "in_progress", None, None)
    try:
        yield event("response.created", response=head)  # at once: the prompt is read after
        yield event("response.in_progress", response=head)
        while True:
            ev = await events.get()
            if isinstance(ev, Yielded) and not isinstance(ev.value, Text):
                prep = ev.value
            elif isinstance(ev, Yielded):
                text += ev.value.piece
                cut = tools.held_back(text) if req.tools.active else len(text)
                if cut > len(shown):
                    if not opened:
                        yield event("response.output_item.added", output_index=0, item=message)
                        part = {"type": "output_text", "text": "", "annotations": []}
                        yield event(
                            "response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=part
                        )
                        opened = True
                    yield event(
                        "response.output_text.delta",
                        item_id=item_id,
                        output_index=0,
                        content_index=0,
                        delta=text[len(shown) : cut],
                    )
                    shown = text[:cut]
            elif isinstance(ev, (Errored, Cancelled)):
                exc = engine_error(ev)
                failed = {**head, "status": "failed", "error": {"code": exc.code, "message": exc.message}}
                yield event("response.failed", response=failed)
                return
            elif isinstance(ev, Returned):
                done = ev.value
                server.metrics.decoded(done["completion_tokens"])
                output = _output(req, done)
                if opened or (output and output[0]["type"] == "message"):
                    final = next((o for o in output if o["type"] == "message"), None)
                    full = final["content"][0]["text"] if final else shown
                    if not opened:
                        yield event("response.output_item.added", output_index=0, item=message)
                        part = {"type": "output_text", "text": "", "annotations": []}
                        yield event(
                            "response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=part
                        )
                    if len(full) > len(shown) and full.startswith(shown):
                        yield event(
                            "response.output_text.delta",
                            item_id=item_id,
                            output_index=0,
                            content_index=0,
                            delta=full[len(shown) :],
                        )
                    part = {"type": "output_text", "text": full, "annotations": []}
                    yield event(
                        "response.output_text.done", item_id=item_id, output_index=0, content_index=0, text=full
                    )
                    yield event(
                        "response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=part
                    )
                    done_item = {**message, "status": "completed", "content": [part]}
                    yield event("response.output_item.done", output_index=0, item=done_item)
                    output = [done_item] + [o for o in output if o["type"] != "message"]
                for k, o in enumerate(output):
                    if o["type"] != "function_call":
                        continue
                    yield event(
                        "response.output_item.added",
                        output_index=k,
                        item={**o, "arguments": "", "status": "in_progress"},
                    )
                    yield event(
                        "response.function_call_arguments.delta", item_id=o["id"], output_index=k, delta=o["arguments"]
                    )
                    yield event(
                        "response.function_call_arguments.done",
                        item_id=o["id"],
                        output_index=k,
                        arguments=o["arguments"],
                    )
                    yield event("response.output_item.done", output_index=k, item=o)
                _store(server, req, rid, output)
                final = _body(server, req, rid, output, "completed", prep, done)
                yield event(f"response.{final['status']}", response=final)  # completed, or incomplete
                return
    finally:
        job.cancel.set()
