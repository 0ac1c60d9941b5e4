"""How tools reach the prompt and how an answer comes back as calls (app/serve/tools.py): Qwen2.5's own
template renders the tools, earlier calls and results; a format without tools gets the generic prompt;
an answer is calls only where every call parses. No model: the template needs only BOS/EOS text."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvgraft.app.proof.chat_format import ChatFormat
from kvgraft.app.serve import tools
from kvgraft.app.serve.api_errors import ApiError
from kvgraft.app.serve.openai_api import parse_request

QWEN = (Path(__file__).parent / "templates" / "qwen2.5-instruct.jinja").read_text()
MODEL = SimpleNamespace(bos=1, eos=2, token_text=lambda t: {1: "", 2: "<|endoftext|>"}[t])
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
BODY = {
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18 degrees"},
    ],
    "tools": [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}
    ],
}


def test_qwens_template_renders_the_tools_the_calls_and_the_results():
    req = parse_request(BODY, chat=True)
    assert tools.template_supports_tools(QWEN)
    text = ChatFormat("template:x", QWEN).render(
        MODEL, tools.for_template(req.messages), True, req.tools.template_tools()
    )
    assert "# Tools" in text and '"name": "get_weather"' in text.split("<tools>\n")[1].split("\n</tools>")[0]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\n18 degrees\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_format_without_tools_gets_the_generic_prompt():
    req = parse_request(BODY, chat=True)
    msgs = tools.generic(req.messages, req.tools)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    assert msgs[2]["content"] == tools.call_text("get_weather", {"city": "Paris"})
    assert msgs[3]["content"] == "<tool_response>\n18 degrees\n</tool_response>"
    none = tools.generic(req.messages, tools.ToolSpec(tools=req.tools.tools, choice="none"))
    assert none[0]["role"] == "user"  # tool_choice none: the tools are not offered


@pytest.mark.parametrize(
    "text, calls, content",
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>', 1, None),
        (
            'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>',
            1,
            "Let me look.",
        ),
        (
            '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima"}}</tool_call>',
            2,
            None,
        ),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"', 0, "same"),  # cut off
        ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>', 0, "same"),  # not a declared tool
        ('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call> and more', 0, "same"),  # text after
        ("<tool_call>not json</tool_call>", 0, "same"),
        ("Just text.", 0, "same"),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', 1, None),  # no tags: bare JSON
        ('[{"name": "get_weather", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]', 2, None),
        ('{"name": "get_weather", "arguments": {}, "extra": 1}', 0, "same"),
        ('{"city": "Oslo"}', 0, "same"),
        ('{{"name": "get_weather", "arguments": {"city": "Oslo"}}}', 1, None),  # Qwen2.5's template's {{...}}
        ('{{"name": "get_weather", "arguments": {"city": "Oslo"}}', 1, None),  # the 1.5B closes it once
        ('{{"name": "get_weather", "arguments": {"city": "Oslo"}}}}', 1, None),  # ... or twice
        ('{{"name": "get_weather", "arguments": {"city": "Oslo"}}} and so on', 0, "same"),
        ('<tool_call>\n{{"name": "get_weather", "arguments": {}}}\n</tool_call>', 1, None),
        ('{"name": {"first": "Ada"}, "age": 36}', 0, "same"),  # a name that is not a string
        ('<tool_call>{"name": ["x"], "arguments": {}}</tool_call>', 0, "same"),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "a</tool_call>b"}}</tool_call>', 1, None),
    ],
)
def test_an_answer_is_calls_only_where_every_call_parses(text, calls, content):
    spec = parse_request(BODY, chat=True).tools
    got = tools.parse_answer(text, spec)
    assert len(got.calls) == calls
    assert got.content == (text if content == "same" else content)
    for c in got.calls:
        assert c["type"] == "function" and c["id"].startswith("call_")
        assert isinstance(json.loads(c["function"]["arguments"]), dict)


def test_a_reply_cut_by_max_tokens_keeps_the_calls_it_completed():
    spec = parse_request(BODY, chat=True).tools
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    for tail in ('\n<tool_call>\n{"name": "get_wea', "\n<tool_", "\n<tool_call>"):
        assert len(tools.parse_answer(one + tail, spec, cut=True).calls) == 1
        assert tools.parse_answer(one + tail, spec).calls == []  # not cut: a broken reply is text
    assert tools.parse_answer('<tool_call>\n{"name": "get_wea', spec, cut=True).calls == []  # none complete
    assert tools.parse_answer(one + " and then text", spec, cut=True).calls == []  # text after a call


def test_the_loop_guard_knows_the_calls_answered_and_their_repeats():
    from kvgraft.app.serve.tools import answered_calls, repeats_answered

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "12 degrees"},
    ]
    req = parse_request({**BODY, "messages": history}, chat=True)
    answered = answered_calls(req.messages, req.tools)
    assert len(answered) == 1
    unanswered = parse_request({**BODY, "messages": history[:2] + [history[0]]}, chat=True)
    assert answered_calls(unanswered.messages, unanswered.tools) == frozenset()
    forced = parse_request({**BODY, "messages": history, "tool_choice": "required"}, chat=True)
    assert answered_calls(forced.messages, forced.tools) == frozenset()  # a client that asks for a call gets one
    same = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert repeats_answered(same, req.tools, answered) and repeats_answered(
        '{"arguments": {"city": "Oslo"}, "name": "get_weather"}', req.tools, answered
    )
    assert not repeats_answered(same.replace("Oslo", "Lima"), req.tools, answered)  # another city: a new call
    assert not repeats_answered("It is 12 degrees in Oslo.", req.tools, answered)


def test_content_streams_up_to_a_calls_tag():
    assert tools.held_back("Sure. <tool") == len("Sure.")
    assert tools.held_back("Sure. <tool_call>\n{") == len("Sure.")
    assert tools.held_back("Plain <b> text") == len("Plain <b> text")
    assert tools.held_back("Let me check.\n<tool_call>") == len("Let me check.")  # what parse_answer keeps
    assert tools.held_back("```python\nprint(1)") == len("```python\nprint(1)")  # code is not a call
    assert tools.held_back(' {"name": "get_weather"') == 0 and tools.held_back("``") == 0  # may be a bare call


def test_the_grammar_follows_tool_choice():
    spec = parse_request({**BODY, "tool_choice": "required"}, chat=True).tools
    lark = tools.grammar_lark(spec, lambda s: s)
    assert lark.startswith('start: call ("\\n" call)*') and '\\"get_weather\\"' in lark
    named = parse_request(
        {**BODY, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, chat=True
    ).tools
    assert tools.grammar_lark(named, lambda s: s).startswith("start: call\n")
    auto_named = {**BODY, "tools": BODY["tools"] + [{"type": "function", "function": {"name": "auto"}}]}
    spec = parse_request({**auto_named, "tool_choice": {"type": "function", "function": {"name": "auto"}}}, chat=True)
    assert spec.tools.forced and spec.tools.function == "auto"  # a tool named like a choice is still forced
    assert tools.grammar_lark(parse_request(BODY, chat=True).tools, lambda s: s) is None  # auto: free
    fmt = {**BODY, "response_format": {"type": "json_object"}}
    assert tools.grammar_lark(parse_request(fmt, chat=True).tools, lambda s: s).startswith("start: calls | %json")


def test_bad_tool_fields_are_refused_by_name():
    cases = {
        "tools": {"tools": "nope"},
        "tools[0]": {"tools": [{"type": "retrieval"}]},
        "tools[0].function.name": {"tools": [{"type": "function", "function": {"name": "has space"}}]},
        "tool_choice": {"tool_choice": "sometimes"},
        "parallel_tool_calls": {"parallel_tool_calls": "yes"},
        "response_format": {"response_format": {"type": "xml"}},
        "tools[0].function.name ": {"tools": [{"type": "function", "function": {"name": "f\n"}}]},
        "messages[1].tool_calls[0].function.arguments": {
            "messages": [
                BODY["messages"][0],
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
                BODY["messages"][2],
            ]
        },
    }
    for param, extra in cases.items():
        with pytest.raises(ApiError) as err:
            parse_request({**BODY, **extra}, chat=True)
        assert err.value.param == param.strip(), (param, err.value.message)


def test_a_prefilled_reply_with_tools_or_a_schema_is_refused():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": '{"a": '}]
    for extra in ({"response_format": {"type": "json_object"}}, {"tools": BODY["tools"]}):
        with pytest.raises(ApiError) as err:
            parse_request({"messages": msgs, **extra}, chat=True)
        assert err.value.param == "messages"
    assert parse_request({"messages": msgs}, chat=True).prefill == '{"a": '


def test_cache_control_and_prompt_cache_key_mark_the_messages_they_pin():
    msgs = [
        {
            "role": "system",
            "content": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        },
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    req = parse_request({"messages": msgs, "prompt_cache_key": "k"}, chat=True)
    assert req.messages[0]["_pins"] == [(None, 3600)] and req.messages[2]["_pins"] == [("k", 86400)]
    spec = parse_request(BODY, chat=True).tools
    assert tools.generic(req.messages, spec)[0]["_pins"] == [(None, 3600)]  # kept on the system with the tools
    for ttl in ("1000000000000000d", "0m", "5 minutes", 5, "31d"):
        bad_ttl = [{**msgs[1], "cache_control": {"type": "ephemeral", "ttl": ttl}}]
        with pytest.raises(ApiError) as err:
            parse_request({"messages": bad_ttl}, chat=True)
        assert err.value.param == "messages[0].cache_control.ttl"
    with pytest.raises(ApiError):
        parse_request({"messages": msgs, "prompt_cache_key": 5}, chat=True)
