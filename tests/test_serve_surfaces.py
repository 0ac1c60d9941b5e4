"""The Responses and Messages APIs over the one request core, driven by the official `openai` and
`anthropic` clients against a real `kvgraft serve` on the real Gemma 3 270M: text, tools (calls that
validate under a forced choice), streaming, a conversation continued by previous_response_id (after a
restart too, its state grafted from the library), errors in each API's own shape."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve_fixture import ServerProcess

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(agent_server):
    return agent_server


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


# -- Messages -------------------------------------------------------------------------------------
def test_messages_text_whole_and_streamed_agree(claude):
    kw = dict(
        model="any",
        max_tokens=16,
        system="You answer briefly.",
        messages=[{"role": "user", "content": "Name a color."}],
    )
    whole = claude.messages.create(**kw)
    assert whole.type == "message" and whole.role == "assistant" and whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.content[0].type == "text" and whole.content[0].text
    with claude.messages.stream(**kw) as stream:
        final = stream.get_final_message()
        streamed = "".join(b.text for b in final.content if b.type == "text")
    assert streamed == whole.content[0].text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.cache_read_input_tokens > 0  # the same prompt again: its state reused


def test_messages_tool_use_and_a_tool_result_round_trip(claude):
    tools = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = claude.messages.create(
        model="any", max_tokens=60, messages=ask, tools=tools, tool_choice={"type": "tool", "name": "get_weather"}
    )
    assert r.stop_reason == "tool_use"
    use = next(b for b in r.content if b.type == "tool_use")
    jsonschema.validate(use.input, WEATHER)
    with claude.messages.stream(
        model="any", max_tokens=60, messages=ask, tools=tools, tool_choice={"type": "any"}
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and {b.type for b in final.content} == {"tool_use"}
    for b in final.content:  # "any" allows parallel calls: each a valid call
        jsonschema.validate(b.input, WEATHER)
    follow = ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees"}]},
    ]
    r = claude.messages.create(model="any", max_tokens=20, messages=follow, tools=tools, tool_choice={"type": "none"})
    assert r.stop_reason in ("end_turn", "max_tokens") and r.content[0].type == "text"


def test_count_tokens_is_the_prompt_a_message_is_answered_from(server, claude):
    tools = [{"name": "get_weather", "description": "The weather", "input_schema": WEATHER}]
    kw = dict(
        model="any",
        system="You answer briefly.",
        messages=[{"role": "user", "content": "Which city is warmer, Oslo or Lima? Think of the weather."}],
        tools=tools,
    )
    counted = claude.messages.count_tokens(**kw).input_tokens
    r = claude.messages.create(max_tokens=4, **kw)
    assert counted == r.usage.input_tokens + r.usage.cache_read_input_tokens > 20
    assert claude.messages.count_tokens(**{**kw, "tools": []}).input_tokens < counted  # the tools are in it
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model="any", messages=[{"role": "robot", "content": "hi"}])
    log = server.log.read_text()
    assert "POST /v1/messages/count_tokens 200" in log and "POST /v1/messages ok: prompt" in log  # a line each
    assert all(step in log for step in ("loading the model", "probe: batch-invariant", "ready in"))  # start-up


def test_messages_errors_are_anthropics_shape(server, claude):
    with pytest.raises(anthropic.BadRequestError) as err:
        hi = [{"role": "user", "content": "hi"}]
        claude.messages.create(model="any", max_tokens=5, messages=hi, extra_body={"top_k": 2.5})
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.url + "/v1/messages", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


# -- Responses ------------------------------------------------------------------------------------
def test_responses_text_and_previous_response_id_after_a_restart(tmp_path):
    srv = ServerProcess(tmp_path / "home").start()
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        first = c.responses.create(
            model="any", instructions="Answer briefly.", input="Who keeps the ledger?", max_output_tokens=12
        )
        assert first.status in ("completed", "incomplete") and first.output_text
    finally:
        srv.stop()
    srv = ServerProcess(tmp_path / "home").start()
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        then = c.responses.create(  # instructions are not carried over (OpenAI's rule): sent again
            model="any",
            instructions="Answer briefly.",
            previous_response_id=first.id,
            input="And where is it kept?",
            max_output_tokens=8,
        )
        assert then.previous_response_id == first.id and then.output_text
        # the first conversation's state came from the library: most of the prompt was not computed
        assert then.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
        with pytest.raises(openai.BadRequestError):
            c.responses.create(model="any", previous_response_id="resp_" + "0" * 24, input="hi")
    finally:
        srv.stop()


def test_responses_function_call_streamed_and_whole(oai):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER}]
    forced = {"type": "function", "name": "get_weather"}
    r = oai.responses.create(
        model="any", input="Weather in Oslo?", tools=tools, tool_choice=forced, max_output_tokens=60
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    with oai.responses.stream(
        model="any", input="Weather in Oslo?", tools=tools, tool_choice=forced, max_output_tokens=60
    ) as s:
        final = s.get_final_response()
    got = [(o.name, o.arguments) for o in final.output if o.type == "function_call"]
    assert got == [(calls[0].name, calls[0].arguments)]
    after = oai.responses.create(
        model="any",
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "cold, 2 degrees"}],
        tools=tools,
        tool_choice="none",
        max_output_tokens=16,
    )
    assert after.output and after.output[0].type == "message"


def test_responses_text_streams_as_the_whole_answer(oai):
    kw = dict(model="any", input="Name three colors.", max_output_tokens=16)
    whole = oai.responses.create(**kw)
    deltas, final = [], None
    with oai.responses.stream(**kw) as s:
        for ev in s:
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
            elif ev.type in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens
                final = ev.response
                assert final.status == whole.status == ev.type.split(".")[1]
    assert "".join(deltas) == final.output_text == whole.output_text


ITEM = st.one_of(
    st.text(max_size=20),
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "robot"]),
            "content": st.text(max_size=10)
            | st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["input_text", "input_image"]), "text": st.text(max_size=5)}
                ),
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["function_call", "function_call_output", "reasoning"]),
            "call_id": st.text(max_size=4),
            "name": st.text(max_size=5),
            "output": st.text(max_size=5),
        }
    ),
)
BLOCK = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["text", "tool_use", "tool_result", "image"]),
        "text": st.text(max_size=8),
        "input": st.none() | st.just({}),
        "name": st.text(max_size=4),
    }
)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    items=st.lists(ITEM, max_size=3) | st.text(max_size=10),
    blocks=st.lists(BLOCK, max_size=3),
    role=st.sampled_from(["user", "assistant"]),
)
def test_items_and_blocks_never_get_a_5xx(server, items, blocks, role):
    r = httpx.post(
        server.url + "/v1/responses", json={"model": "any", "input": items, "max_output_tokens": 2}, timeout=120
    )
    assert r.status_code < 500 and "Traceback" not in r.text, r.text
    body = {"model": "any", "max_tokens": 2, "messages": [{"role": role, "content": blocks}]}
    r = httpx.post(server.url + "/v1/messages", json=body, timeout=120)
    assert r.status_code < 500 and "Traceback" not in r.text, r.text
    if r.status_code != 200:
        assert r.json()["type"] == "error"
