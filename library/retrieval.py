"""Which stored document a question is about: FTS5 BM25 ranking and query-term coverage. Mixed into `Library`.

BM25 scores grow with the library (a rare term's IDF does), so no fixed score says "relevant". What
does not drift is coverage: the share of the question's content words, weighted by how rare each is
in the library (BM25's IDF; a word found in no entry weighs the most), that the document contains.
A question about a name the library holds covers almost all of it in the right document; a question
about a name it does not hold leaves that name uncovered in every document.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .records import GRAFTABLE, Entry

STOPWORDS = frozenset(
    "a an and are as at be but by can could did do does for from had has have how i if in into is it its me "
    "my no not of on or our so than that the their them then there these they this those to us was we were "
    "what when where which who whom whose why will with would you your".split()
)


@dataclass(frozen=True)
class Ranked:
    entry: Entry
    score: float  # -bm25 (title weighted 2): higher ranks first
    coverage: float  # 0..1: the IDF-weighted share of the question's content words the entry contains
    # (a word it holds only through the stemmer counts STEM_ONLY of its weight)
    wording: float = 0.0  # 0..1: the plain share of the question's content words other than numbers it contains


def content_terms(question: str) -> list[str]:
    words = "".join(c if c.isalnum() else " " for c in question.lower()).split()
    seen: dict[str, None] = {}
    for w in words:
        if w not in STOPWORDS and len(w) > 1:
            seen.setdefault(w, None)
    return list(seen)


def numbers_in(text: str) -> list[str]:
    """The numbers a text states, in order ("1,106" and "1106" are one number)."""
    return [n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", text or "")]


def same_numbers(question: str, stored_question: str) -> bool:
    """A worked solution answers one problem: a question is the stored one's only if it states the
    very same numbers (as a multiset, in any order), and at least one."""
    mine = numbers_in(question)
    return bool(mine) and sorted(mine) == sorted(numbers_in(stored_question))


# A question's word that the entry holds only through the stemmer (FTS5's porter tokenizer: "founded"
# for "found", but also the invented place "Fesallys" for the person "Fesal") counts for this share of
# its weight in the coverage; the rare words, names, weigh the most, so a name matched only by its stem
# no longer carries a question over the threshold (measured: scripts/widen.py --qa at 200 documents).
STEM_ONLY = 0.5


def surface_words(entry: Entry) -> set[str]:
    """The entry's words as written (lower case), for telling an exact match from a stemmed one."""
    text = f"{entry.title or ''} {entry.question or ''} {entry.text}".lower()
    return set("".join(c if c.isalnum() else " " for c in text).split())


def _quoted(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


class Retrieval:
    """Ranking of graftable documents for a question (needs the Library's `_db` and `get`)."""

    def rank_documents(self, question: str, fingerprint: str, limit: int = 4) -> list[Ranked]:
        """Graftable documents and stored prefixes for `question`, best BM25 first, each with its
        coverage. Solutions are left out: they share one template, so a query finds a sibling
        problem's worked solution (`rank_solutions` ranks them, for a stricter rule)."""
        return self._rank(question, fingerprint, "('document', 'prefix')", limit)

    def rank_solutions(self, question: str, fingerprint: str, limit: int = 4) -> list[Ranked]:
        """Graftable worked solutions for `question`, best BM25 first, each with its coverage."""
        return self._rank(question, fingerprint, "('solution')", limit)

    def rank_elsewhere(self, question: str, fingerprint: str, limit: int = 4) -> list[Ranked]:
        """Proven documents, prefixes and solutions made under any other fingerprint than `fingerprint`
        (other settings, another model): what a rebuild for this engine would make graftable."""
        return self._rank(question, fingerprint, "('document', 'prefix', 'solution')", limit, same=False)

    def _rank(self, question: str, fingerprint: str, kinds: str, limit: int, same: bool = True) -> list[Ranked]:
        terms = content_terms(question)
        if not terms:
            return []
        q = self._db.execute
        op = "=" if same else "!="
        rows = q(
            "SELECT e.id, -bm25(entries_fts, 2.0, 1.0, 1.0) FROM entries_fts f JOIN entries e ON e.id = f.rowid "
            f"WHERE entries_fts MATCH ? AND e.kind IN {kinds} AND e.fingerprint {op} ? AND {GRAFTABLE} "
            "ORDER BY bm25(entries_fts, 2.0, 1.0, 1.0) LIMIT ?",
            [" OR ".join(_quoted(t) for t in terms), fingerprint, limit],
        ).fetchall()
        if not rows:
            return []
        n = q("SELECT count(*) FROM entries_fts").fetchone()[0]
        idf = {}
        for t in terms:  # the FTS tokenizer stems each term as it stemmed the texts
            df = q("SELECT count(*) FROM entries_fts WHERE entries_fts MATCH ?", [_quoted(t)]).fetchone()[0]
            idf[t] = math.log((n - df + 0.5) / (df + 0.5) + 1.0)
        total = sum(idf.values())
        out = []
        for entry_id, score in rows:
            entry = self.get(entry_id)
            surface = surface_words(entry)
            have = [
                t
                for t in terms
                if q(
                    "SELECT 1 FROM entries_fts WHERE rowid = ? AND entries_fts MATCH ?", [entry_id, _quoted(t)]
                ).fetchone()
            ]
            words = [t for t in terms if not t.isdigit()]
            out.append(
                Ranked(
                    entry,
                    float(score),
                    sum(idf[t] * (1.0 if t in surface else STEM_ONLY) for t in have) / total if total else 0.0,
                    sum(not t.isdigit() for t in have) / len(words) if words else 0.0,
                )
            )
        return out
