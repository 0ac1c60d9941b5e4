"""How a worked solution is stored and asked on each kind of model: the contract behind its receipts.

A base model without a chat template (the embedded Gemma 3 270M) keeps the Q/A format of
app/proof/prompts.py ("qa-v1"): the stored text starts with "Q: ", the question is asked as "Q: ... / A:"
and the answer copied to the newline.

An instruct model (its GGUF has `tokenizer.chat_template`) is asked through its own template ("turns-v1"):
the stored text is the template's rendering of one earlier exchange,

    user:      <the problem> + ANSWER_INSTRUCTION
    assistant: <the worked solution, ending with a line "Answer: N">

and a question after it is the template's next user turn with the same instruction, then the assistant's
generation prompt: the model works the new problem out after a verified example of the kind and ends with
its own "Answer: N" line, which `final_answer` reads. Asked fresh, the same user turn comes first.

The stored text holds the template's control tokens as text ("<|im_start|>"): it is tokenized with them
parsed as control tokens (`entry_tokens`), everywhere an entry's text becomes tokens (deposit, pack import,
rebuild, replay). A solution's format is read from its text: a template-format text starts as the model's
template starts a stored exchange and holds ANSWER_INSTRUCTION; anything else (the Q/A format starts with
"Q: ", a solution deposited in free form) is tokenized and asked as plain text. A template that rewrites
earlier turns when a question follows cannot hold a stored solution: such a model keeps the Q/A format.
"""

from __future__ import annotations

import re

from kvgraft.app.proof.chat_format import ChatFormat, ChatFormatError, template_tokens
from kvgraft.app.proof.prompts import ask_suffix, solution_text

TURNS_FORMAT = "turns-v1"
ANSWER_INSTRUCTION = (
    "Solve it step by step, briefly. End with a final line of the form 'Answer: N', where N is the number."
)
_PLACEHOLDER = ("a problem", "a worked solution")
_ANSWER_LINE = re.compile(r"^\s*\**\s*answer\s*\**\s*:\s*\**\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
SOLUTION_KINDS = ("solution", "answer")
TURNS_ANSWER_TOKENS = 384  # an instruct model's worked answer after a stored solution


def user_text(question: str) -> str:
    """A problem as the user's turn says it to an instruct model."""
    return f"{question.strip()}\n\n{ANSWER_INSTRUCTION}"


def reply_text(solution: str, answer: str) -> str:
    """The assistant's turn of a stored exchange: the worked solution, ending with its 'Answer: N' line."""
    body = solution.strip()
    if final_answer(body.splitlines()[-1] if body else "") is None:
        body = f"{body}\n\nAnswer: {answer.strip()}"
    return body


def final_answer(text: str) -> str | None:
    """What the last 'Answer: ...' line of a worked answer states (None: there is none)."""
    found = _ANSWER_LINE.findall(text)
    return found[-1].strip().strip("*").strip().rstrip(".") if found else None


_HEADS: dict[tuple[str, str], str | None] = {}  # (template, bos text) -> what the template writes before a problem


def _head(model) -> str | None:
    """What the model's template writes before the first problem of a stored exchange; None when the model
    has no template, or one that cannot hold a stored solution (it rewrites earlier turns when a question
    follows): such a model keeps the Q/A format."""
    template = model.chat_template
    if not template:
        return None
    key = (template, model.token_text(model.bos))
    if key not in _HEADS:
        fmt = ChatFormat.for_model(model)
        try:
            _suffix_text(fmt, model, _exchange(*_PLACEHOLDER), "another problem")
            rendered = fmt.render(model, _exchange("\x00", "\x01"), False)
            _HEADS[key] = rendered[: rendered.index("\x00")] if "\x00" in rendered else None
        except ChatFormatError:
            _HEADS[key] = None
    return _HEADS[key]


def uses_turns(model) -> bool:
    """Whether solutions on this model are stored and asked through its chat template."""
    return _head(model) is not None


def is_turns_text(model, kind: str, text: str) -> bool:
    """Whether an entry's text is a solution stored in the template format: it starts as the template starts
    a stored exchange and holds the answer instruction. Any other text (a Q/A solution, a solution deposited
    in free form, a document) is tokenized and asked as plain text."""
    if kind not in SOLUTION_KINDS or text.startswith("Q: ") or ANSWER_INSTRUCTION not in text:
        return False
    head = _head(model)
    return head is not None and text.startswith(head)


def entry_tokens(model, kind: str, text: str) -> list[int]:
    """The tokens of an entry's stored text (without the question suffix of an answer-ready state)."""
    if is_turns_text(model, kind, text):
        return template_tokens(model, text, at_start=True)
    return model.tokenize(text)


def _exchange(question: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": user_text(question)}, {"role": "assistant", "content": reply}]


def _suffix_text(fmt: ChatFormat, model, history: list[dict], question: str) -> str:
    before = fmt.render(model, history, False)
    after = fmt.render(model, [*history, {"role": "user", "content": user_text(question)}], True)
    if not after.startswith(before):
        raise ChatFormatError("the model's chat template rewrites earlier turns: it cannot hold a stored solution")
    return after[len(before) :]


def stored_text(model, question: str, solution: str, answer: str) -> str:
    """The text deposited for a verified solution on this model (Q/A, or the template's exchange)."""
    if not uses_turns(model):
        return solution_text(question, solution, answer)
    fmt = ChatFormat.for_model(model)
    history = _exchange(question, reply_text(solution, answer))
    text = fmt.render(model, history, False)
    # the question suffix must be the same whatever the exchange says (checked here, on the real text), and the
    # text must read back as the template format; else this solution is stored in the Q/A format
    try:
        same = _suffix_text(fmt, model, history, question) == turns_suffix(model, question)[0]
    except ChatFormatError:
        same = False
    return text if same and is_turns_text(model, "solution", text) else solution_text(question, solution, answer)


def question_suffix(model, text: str, question: str) -> tuple[str, list[int]]:
    """(the text, its tokens) that ask `question` after a stored solution whose text is `text`: the
    template's next user turn and generation prompt for a template-format text, else the Q/A suffix."""
    if is_turns_text(model, "solution", text):
        return turns_suffix(model, question)
    suffix = ask_suffix(question)
    return suffix, model.tokenize(suffix, add_bos=False)


def turns_suffix(model, question: str) -> tuple[str, list[int]]:
    """The template's next user turn asking `question` after a stored exchange (the same after any exchange)."""
    suffix = _suffix_text(ChatFormat.for_model(model), model, _exchange(*_PLACEHOLDER), question)
    return suffix, template_tokens(model, suffix, at_start=False)


def answer_decoding(model, text: str, qa_budget: int, turns_budget: int = TURNS_ANSWER_TOKENS) -> tuple[int, list[str]]:
    """(token budget, stop strings) for the answer after a stored solution: Q/A answers are copied to the
    newline; an instruct model works the problem out and ends its turn (an end-of-generation token)."""
    return (turns_budget, []) if is_turns_text(model, "solution", text) else (qa_budget, ["\n"])


def checked_part(model, text: str, decoded: str) -> str | None:
    """What a checker reads of an answer decoded after the solution `text`: a Q/A answer whole, an
    instruct model's final 'Answer: N' line (None: it wrote none, so nothing can pass)."""
    return final_answer(decoded) if is_turns_text(model, "solution", text) else decoded


def fresh_tokens(model, question: str) -> list[int]:
    """A problem asked with nothing before it, through the template (instruct models only)."""
    fmt = ChatFormat.for_model(model)
    return template_tokens(model, fmt.render(model, [{"role": "user", "content": user_text(question)}], True), True)
