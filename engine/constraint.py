"""Constrained decoding: a grammar (llguidance) masks the tokens the decode loop may choose.

A `Grammar` is compiled text (a Lark grammar, or a JSON schema through `Grammar.json_schema`),
checked against the model's vocabulary before anything is queued: `GrammarError` carries
llguidance's message. `Grammar.matcher()` gives a `Constraint`, one per generation: at each step the
decode loop asks it for `allowed(logits)`, a masked copy of the logits (the tokens the grammar does not
allow at -inf); llama.cpp's logits are never written, so a constrained answer's tokens leave the context
with the same bits as any other tokens. End of generation is allowed only where the grammar accepts
(the model's end-of-generation tokens are the grammar's end); once the grammar can take nothing more,
the loop stops ("grammar").

The vocabulary as llguidance sees it (`vocabulary`) is built once per model from llama.cpp's token
bytes (about a second for a 262K vocabulary): control tokens are marked special (a grammar cannot spell
them), every other token, user-defined ones such as Qwen's "<tool_call>" included, is its bytes, so a
grammar's literal "<tool_call>" lets the model write the one token it was trained on.

JSON is compiled compact, with the separators `json.dumps` writes (", " and ": ") and no other
whitespace: a small model left free to write whitespace can loop on newlines until max_tokens. An
integer the schema leaves unbounded is held to int64's range, and `Constraint.within` closes the answer
before max_tokens ends it (engine/closing.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import threading
import weakref

import llguidance
import numpy as np

from .bindings import llama
from .closing import VocabFacts, close_path
from .errors import EngineError

# JSON as json.dumps writes it: applied to every schema (x-guidance overrides the schema's own)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# an integer without bounds is held to int64's: the largest float64 below 2**63 (llguidance reads bounds as
# float64, and 2**63 - 1 rounds up past what int64 holds), so no answer writes digits until max_tokens
INT_BOUND = 2**63 - 1024
_VALUES = ("enum", "const", "default", "examples", "x-guidance")  # data, not schemas: left as they are
_vocabularies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class GrammarError(EngineError):
    """A grammar or schema llguidance cannot compile (its message says why)."""


def vocabulary(model) -> llguidance.LLTokenizer:
    """llguidance's view of `model`'s vocabulary, built once per model (thread-safe)."""
    return _vocabulary(model)[0]


def vocab_facts(model) -> VocabFacts:
    """What the closer (engine/closing.py) reads of the vocabulary, built in the same pass."""
    return _vocabulary(model)[1]


def _vocabulary(model) -> tuple[llguidance.LLTokenizer, VocabFacts]:
    with _lock:
        built = _vocabularies.get(model)
        if built is None:
            built = _vocabularies[model] = _build(model)
        return built


def _build(model) -> tuple[llguidance.LLTokenizer, VocabFacts]:
    vocab = model.vocab
    n = model.info.n_vocab
    buf = ctypes.create_string_buffer(1024)
    pieces: list[bytes] = []
    control: list[bool] = []
    eog: list[int] = []
    for t in range(n):
        k = llama.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
        pieces.append(buf.raw[: max(k, 0)])
        control.append(bool(llama.llama_vocab_get_attr(vocab, t) & llama.LLAMA_TOKEN_ATTR_CONTROL))
        if model.is_eog(t):
            eog.append(t)
    fptr = ctypes.cast(llama.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
    marked = [b"\xff" + p if c else p for p, c in zip(pieces, control, strict=True)]  # special: never spelled
    tok = llguidance.LLTokenizer.from_llamacpp(
        tokens=marked, vocab_ptr=vocab, tokenize_fptr=fptr, eos_token=eog or [model.eos], slices=None
    )
    return tok, VocabFacts.from_pieces(pieces, control)


class Grammar:
    """A compiled, checked grammar for one model. `text` is what llguidance runs; `sha256` names it
    (a constrained answer records it: the same grammar, prompt and sampling choose the same tokens)."""

    def __init__(self, model, text: str) -> None:
        self.model, self.text = model, text
        self.sha256 = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self._tok = vocabulary(model)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, self._tok)
        if failed:
            raise GrammarError(messages[0] if messages else "the grammar does not compile")

    @classmethod
    def lark(cls, model, lark: str) -> "Grammar":
        return cls(model, llguidance.LLMatcher.grammar_from_lark(lark))

    @classmethod
    def json_schema(cls, model, schema: dict) -> "Grammar":
        """A JSON value valid against `schema` (`{}` or `{"type": "object"}` for any object)."""
        try:
            text = llguidance.LLMatcher.grammar_from_json_schema(styled(schema))
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        return cls(model, text)

    def matcher(self) -> "Constraint":
        return Constraint(self)


def styled(schema: dict) -> dict:
    """`schema` with kvgraft's JSON style in its x-guidance options (for %json blocks in Lark too), and
    every integer without bounds held to what int64 holds (`INT_BOUND`)."""
    if not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object")
    options = schema.get("x-guidance") or {}
    if not isinstance(options, dict):
        raise GrammarError("x-guidance must be an object")
    return {**_bounded(schema), "x-guidance": {**options, **JSON_STYLE}}


def _bounded(node):
    """A copy of a schema (or part of one) whose integers have a minimum and a maximum."""
    if isinstance(node, list):
        return [_bounded(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in _VALUES else _bounded(v) for k, v in node.items()}
    kind = node.get("type")
    if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
        if "minimum" not in node and "exclusiveMinimum" not in node:
            out["minimum"] = -INT_BOUND
        if "maximum" not in node and "exclusiveMaximum" not in node:
            out["maximum"] = INT_BOUND
    return out


class Constraint:
    """One generation's walk through a grammar: `allowed` masks, `advance` takes the chosen token."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self._m = llguidance.LLMatcher(grammar._tok, grammar.text, log_level=0)
        if self._m.is_error():
            raise GrammarError(self._m.get_error())
        n = grammar.model.info.n_vocab
        self._n = n
        self._bits = np.zeros((n + 31) // 32, dtype=np.int32)
        self._scratch = np.zeros_like(self._bits)
        self._facts = vocab_facts(grammar.model)  # built with the vocabulary the grammar was checked against
        self._plan: list[int] | None = None  # a path that closes the grammar from here (engine/closing.py)

    def allowed(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` with every token the grammar does not allow next at -inf."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        if self._m.is_error():
            raise EngineError(f"the grammar failed: {self._m.get_error()}")
        ok = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._n].astype(bool)
        out = np.full_like(logits, -np.inf)
        out[ok] = logits[ok]
        return out

    def shortest(self, limit: int) -> int | None:
        """How many tokens the closer needs to take this state to one the grammar accepts (None: not
        within `limit`): an upper bound on the shortest answer from here (engine/closing.py)."""
        path = close_path(self._m, self._facts, self._scratch, limit)
        return None if path is None else len(path)

    def within(self, token: int, room: int) -> int:
        """The token to take with `room` tokens left, this one included: the model's masked choice
        `token` where the grammar can still be closed in room - 1 tokens after it, else the next token of
        the path that closes it from here (so the answer parses when the budget ends)."""
        if self.grammar.model.is_eog(token) and self._m.is_accepting():
            return token
        if self._plan is None:
            self._plan = close_path(self._m, self._facts, self._scratch, room) or []
        if self._plan and self._plan[0] == token:
            self._plan = self._plan[1:]
            return token
        after = self._m.deep_copy()
        if after.consume_token(int(token)):
            path = close_path(after, self._facts, self._scratch, room - 1)
            if path is not None:
                self._plan = path
                return token
        if not self._plan:  # no path from here either: the budget was too small from the start
            return token
        token, self._plan = self._plan[0], self._plan[1:]
        return token

    def advance(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise EngineError(f"the grammar refused token {token}: {self._m.get_error()}")

    @property
    def done(self) -> bool:
        """Nothing more can follow: the grammar is complete and allows no other token."""
        return self._m.is_stopped()

    @property
    def accepting(self) -> bool:
        return self._m.is_accepting()


def compile_json_schema(model, schema) -> Grammar:
    """`Grammar.json_schema`, for a schema that may arrive as a JSON string."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise GrammarError(f"the schema is not JSON: {exc}") from None
    return Grammar.json_schema(model, schema)
