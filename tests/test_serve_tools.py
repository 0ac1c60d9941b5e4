"""Tool calls and structured output from `kvgraft serve`, driven by the official `openai` client: a real
server process on the real Gemma 3 270M (the generic tool prompt: it has no chat template) and on a
synthetic GGUF carrying Qwen2.5's chat template with its tools section (the template path). Under a
grammar the calls are well formed and the JSON validates, however poor the model's choice."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scripts.synthetic_gguf import write_synthetic_gguf
from tests.serve_fixture import ServerProcess

QWEN_TEMPLATE = (Path(__file__).parent / "templates" / "qwen2.5-instruct.jinja").read_text()
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a city",
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]},
        },
    },
]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "admin": {"type": "boolean"}},
    "required": ["name", "admin"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(agent_server):
    return agent_server


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-template")
    path = write_synthetic_gguf(root / "qwen-tools.gguf", "qwen2", seed=3, chat_template=QWEN_TEMPLATE)
    srv = ServerProcess(root / "home", "--model", str(path), "--n-ctx", "2048").start()
    yield srv
    srv.stop()


def _check_calls(message, names=("get_weather", "get_time")):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in names
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)


def test_required_and_named_tool_choice_give_valid_calls(client):
    r = client.chat.completions.create(
        model="any", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=80
    )
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(r.choices[0].message)
    assert len(r.choices[0].message.tool_calls) == 1
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model="any", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=80)
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(r.choices[0].message, names=("get_time",))


def test_a_tool_whose_schema_has_refs_is_called_with_valid_arguments(client):
    closed = {"type": "object", "additionalProperties": False}  # a small model may add keys without end
    place = {**closed, "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}
    params = {
        **closed,
        "$defs": {"Place": place},
        "properties": {"where": {"$ref": "#/$defs/Place"}},
        "required": ["where"],
    }
    tool = {"type": "function", "function": {"name": "visit", "parameters": params}}
    named = {"type": "function", "function": {"name": "visit"}}
    r = client.chat.completions.create(model="any", messages=ASK, tools=[tool], tool_choice=named, max_tokens=60)
    assert r.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(r.choices[0].message.tool_calls[0].function.arguments), params)


def test_streamed_tool_calls_assemble_into_the_same_calls(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    whole = client.chat.completions.create(model="any", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=80)
    with client.chat.completions.stream(
        model="any", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=80
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    got = [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls]
    assert got == [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]


def test_auto_answers_text_or_calls_and_takes_a_history_of_calls_and_results(client):
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
    ]
    for tool_choice in ("auto", "none"):
        r = client.chat.completions.create(
            model="any", messages=history, tools=TOOLS, tool_choice=tool_choice, max_tokens=40
        )
        choice = r.choices[0]
        if choice.finish_reason == "tool_calls":
            assert tool_choice == "auto"
            _check_calls(choice.message)
        else:
            assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
            assert isinstance(choice.message.content, str)
        if tool_choice == "auto":  # the loop guard: never the call whose result is in the history again
            asked = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
            assert ("get_weather", {"city": "Paris", "unit": "c"}) not in asked
            streamed = client.chat.completions.create(
                model="any", messages=history, tools=TOOLS, max_tokens=40, stream=True
            )
            text = "".join(ch.choices[0].delta.content or "" for ch in streamed if ch.choices)
            assert text == (choice.message.content or "")  # what streamed is what the whole answer says


def test_response_format_json_schema_validates_and_json_object_parses(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    msgs = [{"role": "user", "content": "Describe the harbor master as JSON."}]
    r = client.chat.completions.create(model="any", messages=msgs, response_format=fmt, max_tokens=80)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    msgs = [{"role": "user", "content": 'Reply with {"ok": true} and nothing else.'}]
    r = client.chat.completions.create(
        model="any", messages=msgs, response_format={"type": "json_object"}, max_tokens=60
    )
    if r.choices[0].finish_reason == "stop":  # a small model may write an object longer than max_tokens
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_what_cannot_be_applied_is_refused_by_name(client):
    cases = [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
            "response_format",
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"top_k": 2.5}, "top_k"),
        ({"mirostat": 2}, "mirostat"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"x-guidance": 5}}}}, "response_format"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="any", messages=ASK, max_tokens=4, extra_body=extra)
        assert err.value.body["param"] == param, err.value.body
    ok = client.chat.completions.create(model="any", messages=ASK, max_tokens=2, frequency_penalty=0, logit_bias={})
    assert ok.choices[0].message.content is not None


def test_llama_cpps_sampler_fields_change_the_answer_and_repeat_it(client):
    """top_k, min_p, repeat_penalty and the OpenAI penalties are applied (engine/sampling.py), not ignored."""
    ask = [{"role": "user", "content": "Say the word tide ten times: tide tide tide"}]

    def answer(**extra) -> str:
        r = client.chat.completions.create(model="any", messages=ask, max_tokens=16, extra_body=extra)
        return r.choices[0].message.content

    plain = answer()
    penalized = answer(repeat_penalty=1.6, repeat_last_n=-1)
    assert penalized != plain and answer(repeat_penalty=1.6, repeat_last_n=-1) == penalized
    assert answer(frequency_penalty=1.5) != plain
    assert answer(temperature=1.0, top_k=1, seed=5) == plain  # one candidate left: the argmax
    seeded = {"temperature": 1.2, "top_k": 40, "min_p": 0.05, "seed": 9}
    assert answer(**seeded) == answer(**seeded)


def test_models_retrieve_and_a_prefilled_reply_is_continued(client):
    mid = client.models.list().data[0].id
    assert client.models.retrieve(mid).id == mid
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    msgs = [{"role": "user", "content": "Count from one to five."}]
    whole = client.chat.completions.create(model="any", messages=msgs, max_tokens=12).choices[0].message.content
    head = whole.split()[0]
    rest = client.chat.completions.create(
        model="any", messages=msgs + [{"role": "assistant", "content": head}], max_tokens=12
    )
    assert rest.choices[0].message.content  # what follows the prefilled start, not the start again
    assert not rest.choices[0].message.content.startswith(head + " " + head)


def test_a_stream_sends_its_headers_and_role_at_once(server):
    long = "The harbor opens at dawn and the red boats leave first. " * 150  # ~1,800 tokens to prefill
    body = {"model": "any", "messages": [{"role": "user", "content": long}], "max_tokens": 2, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        t_role = time.perf_counter() - t0
        rest = [line for line in lines if line.startswith("data:")]
    assert json.loads(first[5:])["choices"][0]["delta"]["role"] == "assistant"
    usage = [json.loads(x[5:]) for x in rest if x != "data: [DONE]"]
    assert usage and all("error" not in u for u in usage)
    assert t_role < (time.perf_counter() - t0) / 2  # the role came before the prompt was read


def test_the_template_path_renders_tools_and_constrains_calls(qwen_server):
    c = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    plain = c.chat.completions.create(model="any", messages=ASK, max_tokens=1)
    with_tools = c.chat.completions.create(model="any", messages=ASK, tools=TOOLS, max_tokens=1)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 100  # the template's tools section
    r = c.chat.completions.create(
        model="any", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=120
    )
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message.content
    _check_calls(r.choices[0].message)
    r = c.chat.completions.create(model="any", messages=ASK, tools=TOOLS, max_tokens=20)  # random weights: text
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


FUZZ_SCHEMA = st.recursive(
    st.sampled_from([{"type": t} for t in ("string", "integer", "boolean", "null", "number", "nope", 5)])
    | st.just({"enum": ["a", "b"]}),
    lambda inner: (
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=6), inner, max_size=3)}
        )
        | st.fixed_dictionaries({"type": st.just("array"), "items": inner})
    ),
    max_leaves=6,
)
FUZZ_TOOL = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function", "function", "other"]),
        "function": st.fixed_dictionaries(
            {"name": st.text(min_size=0, max_size=10) | st.just("f"), "parameters": FUZZ_SCHEMA | st.none()}
        ),
    }
)


@st.composite
def tool_bodies(draw):
    body = {"model": "any", "messages": ASK, "max_tokens": draw(st.integers(1, 4))}
    if draw(st.booleans()):
        body["tools"] = draw(st.lists(FUZZ_TOOL, max_size=3))
    if draw(st.booleans()):
        body["tool_choice"] = draw(
            st.sampled_from(["auto", "none", "required", "bogus", {"type": "function", "function": {"name": "f"}}])
        )
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["text", "json_object", "json_schema", "other"]))
        body["response_format"] = {"type": kind, "json_schema": {"name": "x", "schema": draw(FUZZ_SCHEMA)}}
    body["stream"] = draw(st.booleans())
    return body


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=tool_bodies())
def test_tool_and_schema_bodies_never_get_a_5xx(server, body):
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code < 500 and "Traceback" not in r.text, r.text
    if r.status_code != 200:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    elif body["stream"]:
        assert '"error"' not in r.text and r.text.rstrip().endswith("data: [DONE]")


def test_after_the_fuzz_the_library_is_whole(server):
    from kvgraft.library.library import Library
    from kvgraft.library.maintenance import fsck

    with Library(server.home) as lib:
        assert not fsck(lib)["problems"]
