"""A constrained answer parses at any max_tokens, or is refused with the minimum: tool calls and
`json_schema` answers from a real `kvgraft serve` on the 270M, through the official `openai` client, over
budgets of 16 to 80 tokens and schemas with nested objects, arrays, integers, enums and string lengths
(app/serve/prompt.py `fits`, engine/closing.py)."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "coords": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
            },
        },
        "required": ["city", "coords"],
    },
    {
        "type": "object",
        "properties": {
            "counts": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
            "total": {"type": "integer"},
        },
        "required": ["counts", "total"],
    },
    {
        "type": "object",
        "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "name": {"type": "string", "minLength": 3}},
        "required": ["unit", "name"],
    },
]
ASK = [{"role": "user", "content": "Describe the harbor of Bergen: its name, numbers and places, in detail."}]


@pytest.fixture(scope="module")
def client(agent_server):
    return openai.OpenAI(base_url=agent_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _ask(client, max_tokens: int, schema: dict, tool: bool):
    if tool:
        tools = [{"type": "function", "function": {"name": "record", "parameters": schema}}]
        return client.chat.completions.create(
            model="any", messages=ASK, max_tokens=max_tokens, tools=tools, tool_choice="required"
        )
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    return client.chat.completions.create(model="any", messages=ASK, max_tokens=max_tokens, response_format=fmt)


def _check(r, schema: dict, tool: bool) -> None:
    message = r.choices[0].message
    if tool:
        assert message.tool_calls, (r.choices[0].finish_reason, message.content)
        for call in message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), schema)
    else:
        jsonschema.validate(json.loads(message.content), schema)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(max_tokens=st.integers(16, 80), which=st.integers(0, len(SCHEMAS) - 1), tool=st.booleans())
def test_a_constrained_answer_parses_at_any_budget_or_the_400_names_the_minimum(client, max_tokens, which, tool):
    schema = SCHEMAS[which]
    try:
        r = _ask(client, max_tokens, schema, tool)
    except openai.BadRequestError as err:
        body = err.body
        assert body["param"] == "max_tokens" and body["code"] == "max_tokens_too_small", body
        need = int(re.search(r"takes (\d+) tokens", body["message"]).group(1))
        assert need > max_tokens
        r = _ask(client, need, schema, tool)  # the minimum it named is enough
        assert r.usage.completion_tokens <= need
    else:
        assert r.usage.completion_tokens <= max_tokens
    _check(r, schema, tool)
