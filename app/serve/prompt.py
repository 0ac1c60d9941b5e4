"""The tokens a request means: its chat rendered by the model's format (tools and the history's calls
through the template where it has a tools section, else written as text: app/serve/tools.py), or its
prompt tokenized; the prefix boundaries worth storing, the stop strings, the pins it asks for, and the
grammar its answer is held to. Shared by the completions surfaces and `/v1/messages/count_tokens`, so
a count is the prompt a request would be answered from.
"""

from __future__ import annotations

from kvgraft.app.proof.chat_format import ChatFormat, ChatFormatError, paragraph_boundary
from kvgraft.app.serve import openai_api as api
from kvgraft.app.serve import tools
from kvgraft.app.serve.openai_api import CompletionRequest
from kvgraft.engine.constraint import Grammar, GrammarError, styled
from kvgraft.library.tokens import tokens_sha256


def build(model, req: CompletionRequest) -> tuple[list[int], list[int], tuple[str, ...], tuple]:
    """(tokens, boundaries, stops, pins) of `req`. Raises ChatFormatError where the format cannot render it."""
    stops, pins = req.stop, ()
    if not req.chat:
        tokens = model.tokenize(req.prompt, True)
        return tokens, paragraph_boundary(model, req.prompt, tokens), stops, pins
    spec = req.tools
    fmt = ChatFormat.for_model(model)
    msgs = req.messages if req.prefill is None else req.messages[:-1]
    if tools.template_supports_tools(fmt.template):
        msgs, listed = tools.for_template(msgs), spec.template_tools()
    else:
        msgs, listed = tools.generic(msgs, spec), None
    tokens, boundaries = fmt.conversation_with_boundaries(model, msgs, listed, req.prefill)
    if not spec.constrained:  # under a grammar, the grammar ends the answer
        stops = tuple(dict.fromkeys(stops + fmt.stops))
    if any(m.get("_pins") for m in msgs):
        pins = _pins(fmt, model, msgs, listed, tokens)
    return tokens, boundaries, stops, pins


def _pins(fmt: ChatFormat, model, msgs: list[dict], listed, tokens: list[int]) -> tuple:
    """(name, length, ttl_s) of each pin the messages ask for: the prefix up to the end of the message
    (cache_control: named by its tokens' SHA-256; prompt_cache_key: by the key)."""
    out = []
    for k, m in enumerate(msgs):
        for name, ttl in m.get("_pins", ()):
            try:
                end = fmt.message_end(model, msgs, k + 1, listed, tokens)
            except ChatFormatError:  # a template that cannot render this part alone: no pin here
                end = None
            if end:
                out.append((name or "cache_control:" + tokens_sha256(tokens[:end])[:16], end, ttl))
    return tuple(out)


def grammar(model, spec: tools.ToolSpec) -> Grammar | None:
    """The grammar the answer is held to, compiled once against the model's vocabulary (the first one
    builds llguidance's view of it: about 2 s for 262K tokens); a schema that does not compile is a 400
    naming response_format or tools, whichever holds it."""
    try:
        return Grammar.lark(model, tools.grammar_lark(spec, styled))
    except GrammarError as exc:
        try:  # which part failed: the response_format schema alone, or else a tool's parameters
            if spec.json_schema is not None:
                Grammar.json_schema(model, spec.json_schema)
        except GrammarError as own:
            message = f"the response_format schema does not compile: {own}"
            raise api.bad("response_format", message, "invalid_schema") from None
        raise api.bad("tools", f"a tool's parameters do not compile: {exc}", "invalid_schema") from None


def fits(grammar: Grammar, budget: int) -> None:
    """A 400 naming the minimum where no answer under `grammar` fits in `budget` tokens (engine/closing.py:
    otherwise the answer closes within it, so it parses however the budget cuts it)."""
    if grammar.matcher().shortest(budget) is not None:
        return
    need = grammar.matcher().shortest(1 << 16)
    what = f"{need} tokens" if need is not None else "more tokens than any context holds"
    raise api.bad(
        "max_tokens",
        f"the shortest answer kvgraft finds under this grammar takes {what} on this model, and max_tokens "
        f"(with the context left) allows {budget}: raise max_tokens",
        "max_tokens_too_small",
    )
