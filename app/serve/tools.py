"""Tool calls and structured output for `/v1/chat/completions`: the request fields, the prompt, the
grammar that constrains the answer, and the answer parsed back into `tool_calls`.

The format of a call is Hermes's, the one Qwen2.5's template teaches:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A model whose chat template has a tools section with `<tool_call>` tags (Qwen2.5) gets the tools and
the history's calls and results rendered by its own template. Any other model (the 270M's plain format,
a template without tools) gets `GENERIC`: the tools are described in the system message, an earlier
call is written in the assistant's reply as the tags above, and a tool's result comes back as a user
message `<tool_response>...</tool_response>`.

`tool_choice` "required" constrains the answer to one call (with `parallel_tool_calls`, the default,
one or more) of a declared function, a named function to one call of it, the arguments valid against
the function's schema. (A small model given "required" with parallel calls may repeat a call until
max_tokens: the grammar cannot know when it has enough.) "auto" lets the model choose, unconstrained:
an answer is calls where every call in it parses (the tags, or a bare JSON call: `parse_answer`), and
text otherwise. "none" renders no tools. `response_format` json_object / json_schema constrains a
text answer to JSON (with "auto" and tools: a call or the JSON).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from kvgraft.app.serve.api_errors import bad

NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
GENERIC = (
    "You can call functions. Each function, as a JSON schema:\n{tools}\n\n"
    "To call a function, reply with its name and arguments within <tool_call></tool_call> tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
EMPTY_PARAMS = {"type": "object", "properties": {}}


@dataclass
class ToolSpec:
    """What a request asks of tools and structured output, checked."""

    tools: list[dict] = field(default_factory=list)  # {"name", "description", "parameters"}
    choice: str = "auto"  # "auto", "none", "required", or "function" (then `function` names it)
    function: str | None = None
    parallel: bool = True
    json_schema: dict | None = None  # response_format: {} for json_object, the schema for json_schema
    schema_param: str = "response_format"

    @property
    def active(self) -> bool:
        """The model sees the tools and may answer with calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice != "auto"

    @property
    def constrained(self) -> bool:
        return self.forced or self.json_schema is not None

    def template_tools(self) -> list[dict] | None:
        if not self.active:
            return None
        return [{"type": "function", "function": t} for t in self.tools]


# -- request fields ------------------------------------------------------------------------------
def parse_tools(body: dict) -> ToolSpec:
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            message = f"'{legacy}' is the deprecated form: send 'tools' and 'tool_choice'"
            raise bad(legacy, message, "unsupported_parameter")
    spec = ToolSpec()
    tools = body.get("tools")
    seen: set[str] = set()
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("tools", "'tools' must be a list of {type: function, function: {...}} objects")
        for i, t in enumerate(tools):
            spec.tools.append(_tool(t, i))
            if spec.tools[-1]["name"] in seen:
                raise bad(f"tools[{i}].function.name", f"two tools are named {spec.tools[-1]['name']!r}")
            seen.add(spec.tools[-1]["name"])
    choice = body.get("tool_choice")
    if choice is None:
        spec.choice = "auto"
    elif choice in ("auto", "none", "required"):
        spec.choice = choice
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str) or name not in seen:
            raise bad("tool_choice", f"tool_choice names {str(name)[:64]!r}, which is not one of the tools")
        spec.choice, spec.function = "function", name
    else:
        raise bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a named function")
    if spec.choice == "required" and not spec.tools:
        raise bad("tool_choice", "tool_choice 'required' needs 'tools'")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false")
    spec.parallel = parallel
    spec.json_schema = _response_format(body.get("response_format"))
    return spec


def as_chat_tools(raw, schema_key: str, typed: bool) -> list[dict]:
    """A flat tool list as chat tools: the Responses API's `{type: function, name, description, parameters}`
    (`typed`) or the Messages API's `{name, description, input_schema}`; checked later by `parse_tools`."""
    shape = ("type: function, " if typed else "") + f"name, description, {schema_key}"
    if not isinstance(raw, list):
        raise bad("tools", f"'tools' must be a list of {{{shape}}}")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or (typed and t.get("type") != "function"):
            raise bad(f"tools[{i}]", f"tools[{i}] must be {{{shape}}}: only function tools are supported")
        f = {"name": t.get("name"), "parameters": t.get(schema_key)}
        if t.get("description") is not None:
            f["description"] = t["description"]
        out.append({"type": "function", "function": f})
    return out


def _tool(t, i: int) -> dict:
    where = f"tools[{i}]"
    if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(t.get("function"), dict):
        raise bad(where, f"{where} must be {{type: function, function: {{name, description, parameters}}}}")
    f = t["function"]
    name = f.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad(f"{where}.function.name", f"{where}.function.name must be 1-64 letters, digits, _ . or -")
    desc = f.get("description", "")
    if not isinstance(desc, str):
        raise bad(f"{where}.function.description", f"{where}.function.description must be a string")
    params = f.get("parameters")
    if params is None:
        params = EMPTY_PARAMS
    if not isinstance(params, dict):
        raise bad(f"{where}.function.parameters", f"{where}.function.parameters must be a JSON schema object")
    # the client's order (name, description, parameters), as the template renders it with tojson
    return {"name": name, **({"description": desc} if desc else {}), "parameters": params}


def _response_format(rf) -> dict | None:
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if schema is None and isinstance(js, dict):
            schema = {}  # a json_schema with no schema: any JSON value
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema", "response_format.json_schema.schema must be an object")
        return schema
    raise bad(
        "response_format",
        "'response_format' must be {type: text}, {type: json_object} or {type: json_schema, json_schema: {schema}}",
    )


# -- the grammar ---------------------------------------------------------------------------------
def grammar_lark(spec: ToolSpec, styled) -> str | None:
    """The Lark grammar (llguidance's dialect) the answer must match; None: unconstrained. `styled`
    puts kvgraft's JSON style into a schema (engine/constraint.py)."""
    answer = None
    if spec.json_schema is not None:
        answer = "%json " + json.dumps(styled(spec.json_schema))
    if not spec.active or (spec.choice == "auto" and answer is None):
        return f"start: {answer}" if answer else None
    tools = [t for t in spec.tools if spec.function is None or t["name"] == spec.function]
    # one rule per tool, its schema at the root of its own %json (so its "$ref"s resolve)
    rules = []
    for i, t in enumerate(tools):
        head = json.dumps('{"name": ' + json.dumps(t["name"]) + ', "arguments": ')
        rules += [f'body_{i}: {head} args_{i} "}}"', f"args_{i}: %json " + json.dumps(styled(t["parameters"]))]
    calls = 'call ("\\n" call)*' if spec.parallel and spec.function is None else "call"
    start = calls if spec.forced else f"calls | {answer}"
    return "\n".join(
        [
            f"start: {start}",
            *([f"calls: {calls}"] if not spec.forced else []),
            f'call: "{OPEN}\\n" body "\\n{CLOSE}"',
            "body: " + " | ".join(f"body_{i}" for i in range(len(tools))),
            *rules,
        ]
    )


# -- the prompt ----------------------------------------------------------------------------------
def template_supports_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template and OPEN in template


def for_template(messages: list[dict]) -> list[dict]:
    """Messages as a Hermes-style template reads them: a call's arguments as an object."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}, "id": c["id"]}
                for c in m["tool_calls"]
            ]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def generic(messages: list[dict], spec: ToolSpec) -> list[dict]:
    """Messages with the tools, calls and results written as text, for a format without tools."""
    out: list[dict] = []
    if spec.active:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in spec.tools)
        system = GENERIC.format(tools=listed)
        pins = []
        if messages and messages[0]["role"] == "system":
            system = messages[0]["content"] + "\n\n" + system
            pins = list(messages[0].get("_pins", ()))  # a pin on the system prompt: now on the one holding the tools
            messages = messages[1:]
        out.append({"role": "system", "content": system, "_pins": pins})
    for m in messages:
        pins = list(m.get("_pins", ()))
        if m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + text
                out[-1]["_pins"] += pins
            else:
                out.append({"role": "user", "content": text, "_tool": True, "_pins": pins})
            continue
        if m.get("tool_calls"):
            written = "\n".join(call_text(c["name"], c["arguments"]) for c in m["tool_calls"])
            content = (m["content"] + "\n" if m["content"] else "") + written
            out.append({"role": "assistant", "content": content, "_pins": pins})
            continue
        out.append({"role": m["role"], "content": m["content"], "_pins": pins})
    return [
        {"role": m["role"], "content": m["content"], **({"_pins": m["_pins"]} if m.get("_pins") else {})} for m in out
    ]


def call_text(name: str, arguments: dict) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


# -- the answer ----------------------------------------------------------------------------------
@dataclass
class Parsed:
    content: str | None
    calls: list[dict]  # OpenAI's tool_calls: {id, type, function: {name, arguments (a JSON string)}}


def parse_answer(text: str, spec: ToolSpec, cut: bool = False) -> Parsed:
    """The calls in a reply, or the reply as text where it holds none or one does not parse. Besides the
    tags, a reply that is nothing but a call's JSON object (or a list of them), fenced as ```json or
    not, is a call: small models write that where they forget the tags. A reply `cut` by max_tokens
    keeps the calls it completed before the one that was cut."""
    if not spec.active:
        return Parsed(text, [])
    names = {t["name"] for t in spec.tools}
    at = text.find(OPEN)
    if at < 0:
        bare = FENCE.sub(r"\1", text.strip())
        try:
            obj = json.loads(bare)
        except ValueError:
            obj = _doubled(bare)
            if obj is None:
                return Parsed(text, [])
        calls = [_call(o, names) for o in (obj if isinstance(obj, list) else [obj])]
        return Parsed(None, calls) if calls and all(calls) else Parsed(text, [])
    calls, i = [], at
    decoder = json.JSONDecoder()
    while i < len(text):  # tags, each around one JSON object, with nothing but whitespace between them
        if cut and calls and CLOSE not in text[i:] and (text.startswith(OPEN, i) or OPEN.startswith(text[i:])):
            break  # the last call was cut by max_tokens: the complete ones before it stand
        if not text.startswith(OPEN, i):
            return Parsed(text, [])
        j = _skip_space(text, i + len(OPEN))
        doubled = text.startswith("{{", j)  # Qwen2.5's template shows a call as {{...}}
        try:
            obj, i = decoder.raw_decode(text, j + doubled)
        except ValueError:
            return Parsed(text, [])
        if doubled:
            if not text.startswith("}", i):
                return Parsed(text, [])
            i += 1
        i = _skip_space(text, i)
        call = _call(obj, names)
        if call is None or not text.startswith(CLOSE, i):  # not a declared tool's call, or cut off
            return Parsed(text, [])
        calls.append(call)
        i = _skip_space(text, i + len(CLOSE))
    return Parsed(text[:at].strip() or None, calls)


def _doubled(bare: str):
    """A call written as Qwen2.5's template shows one, `{{...}}`: the object inside the first brace, with
    only closing braces after it (small models write two, one or four of them), else None."""
    if not bare.startswith("{{"):
        return None
    try:
        obj, end = json.JSONDecoder().raw_decode(bare, 1)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and set(bare[end:]) <= {"}"} else None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _call(obj, names: set[str]) -> dict | None:
    """`{"name", "arguments"}` as OpenAI's tool call, or None where it is not a call of a declared tool."""
    if not isinstance(obj, dict) or set(obj) - {"name", "arguments"}:
        return None
    name = obj.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def held_back(text: str) -> int:
    """Where content may be shown up to while a reply streams: before a call's tag, or before a tail
    that may be the start of one (and the whitespace before it, which `parse_answer` strips); nothing
    while the reply may be a bare call (it starts as a JSON object or list, or a ```json fence)."""
    head = text.lstrip()
    if head[:1] in ("{", "[") or (head and (head.startswith("```json") or "```json".startswith(head))):
        return 0
    at = text.find(OPEN)
    if at < 0:  # a tail that may be the start of a tag waits
        at = len(text) - next((k for k in range(min(len(OPEN) - 1, len(text)), 0, -1) if text.endswith(OPEN[:k])), 0)
    return len(text[:at].rstrip())


# -- the loop guard (app/serve/worker.py): an answer that only repeats calls already answered -----
NO_CALL = r"start: /[^\s{<\[`][\s\S]*/"  # Lark (llguidance): a first character that cannot begin a call


def call_key(name: str, arguments) -> str:
    """A call as the loop guard compares them: its name and its arguments, keys sorted."""
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True, ensure_ascii=False)


def answered_calls(messages: list[dict], spec: ToolSpec) -> frozenset:
    """The calls a chat holds with a result after them (`call_key`s), where the model chooses freely
    (tool_choice auto, no response_format): what an answer may not merely repeat."""
    if not spec.active or spec.constrained:
        return frozenset()
    out = set()
    for i, m in enumerate(messages):
        if m.get("tool_calls") and any(later["role"] == "tool" for later in messages[i + 1 :]):
            out.update(call_key(c["name"], c["arguments"]) for c in m["tool_calls"])
    return frozenset(out)


def repeats_answered(text: str, spec: ToolSpec, answered: frozenset) -> bool:
    """The answer is calls only, each one of `answered`."""
    parsed = parse_answer(text, spec)
    return (
        bool(parsed.calls)
        and parsed.content is None
        and all(
            call_key(c["function"]["name"], json.loads(c["function"]["arguments"])) in answered for c in parsed.calls
        )
    )
