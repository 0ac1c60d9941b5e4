"""`kvgraft ask`: answer from the library when it can, fresh when it cannot, and say which.

1. graft: the library holds a graftable entry for this exact (normalized) question. Its state is
   grafted, the question suffix ("Q: <question> / A:") is prefilled and the answer decoded up to
   the newline. If the suffix is the entry's receipt probe, the logits after it are compared with
   the receipt's fresh logits SHA-256: the graft is shown exact on the spot.
2. prefix: the longest stored entry whose tokens start the prompt is grafted and only the rest of
   the prompt is prefilled.
3. fresh: the whole prompt is prefilled and the model works within a token budget.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

from engine.compare import logits_sha256
from library.tokens import tokens_sha256

from .checker import get_checker
from .library_service import LibraryService
from .problems import ask_suffix, fresh_prompt

GRAFT_ANSWER_TOKENS = 24  # an answer copied from a graft is a few tokens and a newline


@dataclass
class AskResult:
    question: str
    answer: str  # what the model decoded (never the stored answer)
    verified_answer: str | None
    answer_checked: bool | None
    source: str  # graft / prefix / fresh
    entry_id: int | None
    tokens_restored: int
    graft_ms: float | None
    tokens_prefilled: int
    tokens_decoded: int
    exact: bool | None  # graft path: exact restore used (and, where a receipt applies, logits matched it)
    receipt_match: bool | None
    wall_ms: float
    stop_reason: str

    def as_dict(self) -> dict:
        return asdict(self)

    def provenance(self) -> str:
        """One line in plain words, for people."""
        if self.source == "fresh":
            return f"fresh - {self.tokens_prefilled:,} tokens prefilled - {self.tokens_decoded} decoded"
        what = f"verified entry #{self.entry_id}" if self.source == "graft" else f"stored prefix #{self.entry_id}"
        exact = "exact graft" if self.exact else "graft NOT shown exact"
        rest = f" - {self.tokens_prefilled:,} prefilled" if self.source == "prefix" else ""
        return (f"from {what} - {self.tokens_restored:,} tokens restored in {self.graft_ms:.0f} ms - {exact}{rest} - "
                f"{self.tokens_decoded} tokens decoded")


def ask(
    service: LibraryService,
    question: str,
    context: str | None = None,
    budget: int = 128,
    use_library: bool = True,
    on_token: Callable[[int, str], bool | None] | None = None,
) -> AskResult:
    engine, lib = service.engine, service.library
    fp = engine.fingerprint
    model = engine.model
    t0 = time.perf_counter()
    if not question.strip():
        raise ValueError("the question is empty")
    entry = lib.find_question(question, fp) if (use_library and context is None) else None
    verified = entry.answer if entry is not None else None
    checker = get_checker((entry.checker if entry is not None else None) or "numeric")

    if entry is not None and entry.graftable(fp):
        suffix = model.tokenize(ask_suffix(question), add_bos=False)
        with engine.session() as s:
            g = service.graft(s, entry)
            s.prefill(suffix)
            receipt_match = None
            if entry.receipt and entry.receipt.get("probe_tokens_sha256") == tokens_sha256(suffix):
                receipt_match = logits_sha256(s.logits()) == entry.receipt.get("fresh_logits_sha256")
            gen = s.generate(GRAFT_ANSWER_TOKENS, stop=["\n"], on_token=on_token)
        answer = gen.text.strip()
        return AskResult(question, answer, verified, checker(answer, verified) if verified is not None else None,
                         "graft", entry.id, g.n_tokens, g.total_ms, len(suffix), len(gen.tokens),
                         receipt_match is not False, receipt_match, (time.perf_counter() - t0) * 1e3, gen.stop_reason)

    if context is not None:
        prompt = model.tokenize(context) + model.tokenize("\n" + ask_suffix(question), add_bos=False)
        stop = ["\n"]
    else:
        prompt = model.tokenize(fresh_prompt(question))
        stop = ["\nQ:"]
        checker = get_checker("final_number") if checker is get_checker("numeric") else checker
    # at least the prompt's last token is always decoded here, so logits exist to start from
    prefix = lib.longest_prefix(prompt[:-1], fp) if use_library and len(prompt) > 1 else None
    with engine.session() as s:
        if prefix is not None:
            g = service.graft(s, prefix)
            rest = prompt[prefix.n_tokens :]
            s.prefill(rest)
            source, restored, graft_ms, prefilled = "prefix", g.n_tokens, g.total_ms, len(rest)
        else:
            s.prefill(prompt)
            source, restored, graft_ms, prefilled = "fresh", 0, None, len(prompt)
        gen = s.generate(budget, stop=stop, on_token=on_token)
    answer = gen.text.strip()
    return AskResult(question, answer, verified, checker(answer, verified) if verified is not None else None,
                     source, prefix.id if source == "prefix" else None, restored, graft_ms, prefilled, len(gen.tokens),
                     True if source == "prefix" else None, None, (time.perf_counter() - t0) * 1e3, gen.stop_reason)
