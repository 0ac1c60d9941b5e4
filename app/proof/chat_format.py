"""Prompt formats for conversations: the model's own chat template, or a plain turn format.

A thread's transcript is kept as token ids, the way the KV holds them; a new message only adds a
segment after them. Where the GGUF has `tokenizer.chat_template`, the segment comes from the template
(rendered in Jinja2's sandbox, as llama-cpp-python renders templates): the rendering of the
conversation so far must be a prefix of the rendering with the new message, and the segment is what
the new message adds (with whatever closes the last reply, e.g. "<|im_end|>\\n"). A template that
rewrites earlier turns is not prefix-stable: then the whole conversation is rendered and tokenized
again, and the longest stored state whose tokens are a prefix of it is grafted (app/answer/chat.py).

Models without a template (the embedded Gemma 3 270M base model) get the plain format, "plain-v1":

    [BOS] [SYSTEM "\\n\\n"] "User: " MESSAGE "\\nAssistant:"     the first turn
    "\\nUser: " MESSAGE "\\nAssistant:"                           each later turn, after the reply's tokens

and replies stop at "\\nUser" or "\\nAssistant" (a small base model often drops the colon), or at an
end-of-generation token. A thread records its format's name
("plain-v1" or "template:" and the template's SHA-256), so a receipt never silently changes meaning.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

PLAIN = "plain-v1"
PLAIN_STOPS = ("\nUser", "\nAssistant")


class ChatFormatError(ValueError):
    pass


def template_tokens(model, text: str, at_start: bool) -> list[int]:
    """Template text as tokens (control tokens parsed). At the start of a transcript the model's BOS
    is added unless the template already wrote it; elsewhere a BOS the template writes is dropped."""
    bos_text = model.token_text(model.bos)
    starts_with_bos = bool(bos_text) and text.startswith(bos_text)
    if not at_start and starts_with_bos:
        text = text[len(bos_text) :]
    return model.tokenize(text, add_bos=at_start and not starts_with_bos, special=True)


def _raise(message: str):
    raise TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False) -> str:
    """`tojson` as Hugging Face's templates expect it (plain json.dumps; Jinja2's own escapes < > &)."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)


@dataclass(frozen=True)
class ChatFormat:
    name: str
    template: str | None = None

    @classmethod
    def for_model(cls, model) -> "ChatFormat":
        template = model.chat_template
        if not template:
            return cls(PLAIN)
        return cls("template:" + hashlib.sha256(template.encode("utf-8")).hexdigest()[:16], template)

    @property
    def stops(self) -> tuple[str, ...]:
        return PLAIN_STOPS if self.template is None else ()

    # -- rendering ----------------------------------------------------------------------------
    def render(self, model, messages: list[dict], add_generation_prompt: bool, tools: list | None = None) -> str:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.filters["tojson"] = _tojson
        try:
            return env.from_string(self.template).render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=model.token_text(model.bos),
                eos_token=model.token_text(model.eos),
            )
        except TemplateError as exc:
            raise ChatFormatError(f"the model's chat template failed: {exc}") from exc

    def _tokens(self, model, text: str, at_start: bool) -> list[int]:
        return template_tokens(model, text, at_start)

    @staticmethod
    def messages(system: str | None, history: list[tuple[str, str]], user: str | None = None) -> list[dict]:
        out = [{"role": "system", "content": system}] if system else []
        for u, r in history:
            out += [{"role": "user", "content": u}, {"role": "assistant", "content": r}]
        if user is not None:
            out.append({"role": "user", "content": user})
        return out

    # -- segments -----------------------------------------------------------------------------
    def first(self, model, system: str | None, user: str, after_state: bool) -> list[int]:
        """The first turn's tokens; `after_state`: they follow a grafted library entry (no BOS)."""
        if self.template is None:
            text = (f"{system}\n\n" if system else "") + f"User: {user}\nAssistant:"
            return model.tokenize(("\n\n" + text) if after_state else text, add_bos=not after_state)
        rendered = self.render(model, self.messages(system, [], user), True)
        return self._tokens(model, rendered, at_start=not after_state)

    def next(self, model, system: str | None, history: list[tuple[str, str]], user: str) -> list[int] | None:
        """The tokens a new message adds after the last reply's; None when the template is not
        prefix-stable here (then the caller renders the whole conversation: `full`)."""
        if self.template is None:
            return model.tokenize(f"\nUser: {user}\nAssistant:", add_bos=False)
        before = self.render(model, self.messages(system, history), False)
        after = self.render(model, self.messages(system, history, user), True)
        last_reply = history[-1][1]
        end = before.rfind(last_reply) if last_reply else -1
        if not after.startswith(before) or end < 0:
            return None
        closing = before[end + len(last_reply) :]  # what the template writes after a reply
        return self._tokens(model, closing + after[len(before) :], at_start=False)

    def full(
        self, model, system: str | None, history: list[tuple[str, str]], user: str, after_state: bool
    ) -> list[int]:
        """The whole conversation with the new message, rendered by the template and tokenized afresh
        (the plain format never needs it: its segments are always a prefix's continuation)."""
        rendered = self.render(model, self.messages(system, history, user), True)
        return self._tokens(model, rendered, at_start=not after_state)

    def conversation(self, model, messages: list[dict]) -> list[int]:
        """A whole conversation ({role, content} dicts, ending with the user's) as the prompt tokens of
        the reply: the template's rendering with the generation prompt, or the plain format (system
        messages first, then "User: ...\nAssistant:" turns with each reply after its "Assistant:")."""
        return self.conversation_with_boundaries(model, messages)[0]

    def conversation_with_boundaries(
        self, model, messages: list[dict], tools: list | None = None, prefill: str | None = None
    ) -> tuple[list[int], list[int]]:
        """`conversation`, and where its messages before the last end: the token count of each such
        prefix of the rendering whose tokens are a prefix of the whole (where a token spans the end
        of a message, that message has no boundary). `tools`: the template's `tools` (OpenAI's tool
        objects). `prefill`: the start of the reply, written after the generation prompt (continued)."""
        if prefill is not None:
            tokens, ends = self.conversation_with_boundaries(model, messages, tools)
            lead = " " if self.template is None and prefill else ""
            return tokens + model.tokenize(lead + prefill, add_bos=False), ends + [len(tokens)]
        if self.template is not None:
            text = self.render(model, messages, True, tools)
            ends = []
            for k in range(1, len(messages)):
                before = self.render(model, messages[:k], False, tools)
                if text.startswith(before):
                    ends.append(len(before))
            tokens = self._tokens(model, text, at_start=True)
            return tokens, _token_ends(tokens, ends, lambda t: self._tokens(model, t, at_start=True), text)
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        text = f"{system}\n\n" if system else ""
        ends = [len(system)] if system else []
        turns = [m for m in messages if m["role"] != "system"]
        for i, m in enumerate(turns):
            if m["role"] == "user":
                text += ("\n" if i else "") + f"User: {m['content']}\nAssistant:"
            else:
                text += f" {m['content']}" if m["content"] else ""
            ends.append(len(text))
        tokens = model.tokenize(text, add_bos=True)
        return tokens, _token_ends(tokens, ends[:-1], lambda t: model.tokenize(t, add_bos=True), text)

    def message_end(self, model, messages: list[dict], k: int, tools: list | None, tokens: list[int]) -> int | None:
        """The token count at which the first `k` messages end in `tokens` (the whole conversation's), or
        None where their rendering is not a token prefix of it (a pin at the end of a message)."""
        if not 0 < k <= len(messages):
            return None
        if self.template is not None:
            head = self._tokens(model, self.render(model, messages[:k], False, tools), at_start=True)
        else:
            head = self.conversation_with_boundaries(model, messages[:k])[0]
        return len(head) if 0 < len(head) <= len(tokens) and tokens[: len(head)] == head else None


def paragraph_boundary(model, text: str, tokens: list[int]) -> list[int]:
    """A completion's one boundary: the token count after its last blank line ("\n\n"), where the text
    before it is a token prefix of the prompt, e.g. a document or a system prompt before its question."""
    end = text.rfind("\n\n")
    if end <= 0:
        return []
    return _token_ends(tokens, [end + 2], lambda t: model.tokenize(t, add_bos=True), text) or _token_ends(
        tokens, [end], lambda t: model.tokenize(t, add_bos=True), text
    )


def _token_ends(tokens: list[int], ends: list[int], tokenize, text: str) -> list[int]:
    """The token counts at which the text prefixes text[:end] end, where their tokens are a prefix of
    `tokens` (a message's end that falls inside a token has none)."""
    out = []
    for end in sorted(set(ends)):
        if 0 < end < len(text):
            head = tokenize(text[:end])
            if 0 < len(head) < len(tokens) and tokens[: len(head)] == head:
                out.append(len(head))
    return out
