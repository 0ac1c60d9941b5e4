"""Entries that hold a question but were made under other settings: named, with what differs, so Ask and
the Chat tab say so ("document #8 holds this but was made with flash attention off") and offer a rebuild
for these settings (app/packs/rebuild.py `rebuild_entries`) instead of answering fresh in silence.

What differs is read from the library's `engines` table (what each fingerprint stands for) against this
engine's fingerprint info; where the library never recorded the other fingerprint, the words say so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from kvgraft.app.answer.thresholds import RETRIEVAL_MIN_COVERAGE


@dataclass(frozen=True)
class MadeElsewhere:
    entry_id: int
    kind: str
    title: str | None
    why: str  # "made with flash attention off", "made with another model", ...

    def as_dict(self) -> dict:
        return asdict(self)

    def words(self) -> str:
        return f"{self.kind} #{self.entry_id} holds this but was {self.why}"


def differences(theirs: dict | None, ours: dict) -> str:
    """What separates another fingerprint's settings from this engine's, in words."""
    if theirs is None:
        return "made under engine settings this library did not record"
    if theirs.get("model_sha256") != ours.get("model_sha256"):
        return "made with another model"
    said = []
    if theirs.get("flash_attn") != ours.get("flash_attn"):
        said.append(f"flash attention {'on' if theirs.get('flash_attn') else 'off'}")
    if (theirs.get("type_k"), theirs.get("type_v")) != (ours.get("type_k"), ours.get("type_v")):
        said.append(f"KV {theirs.get('type_k')}/{theirs.get('type_v')}")
    if (theirs.get("backend"), theirs.get("n_gpu_layers")) != (ours.get("backend"), ours.get("n_gpu_layers")):
        said.append(f"{theirs.get('n_gpu_layers')} GPU layers on {theirs.get('backend')}")
    if said:
        return "made with " + ", ".join(said)
    return "made by another build of llama.cpp or on another CPU family (its probe differs)"


def made_elsewhere(library, question: str, engine, limit: int = 4) -> list[MadeElsewhere]:
    """Proven entries stored for `question` (its question exactly, or a text covering its words) that this
    engine cannot graft because another fingerprint made them; the best first."""
    fp, ours = engine.fingerprint, engine.fingerprint_info
    found, seen = [], set()
    exact = library.find_question(question)
    candidates = [exact] if exact is not None and exact.fingerprint != fp and exact.proven else []
    ranked = library.rank_elsewhere(question, fp, limit)
    candidates += [r.entry for r in ranked if r.coverage >= RETRIEVAL_MIN_COVERAGE]
    engines = library.engines()
    for e in candidates:
        if e.id in seen or e.damaged is not None:
            continue
        seen.add(e.id)
        found.append(MadeElsewhere(e.id, e.kind, e.title, differences(engines.get(e.fingerprint), ours)))
    return found[:limit]
