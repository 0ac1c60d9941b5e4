"""Which stored document a question is about: FTS5 BM25 ranking and query-term coverage. Mixed into `Library`.

BM25 scores grow with the library (a rare term's IDF does), so no fixed score says "relevant". What
does not drift is coverage: the share of the question's content words, weighted by how rare each is
in the library (BM25's IDF; a word found in no entry weighs the most), that the document contains.
A question about a name the library holds covers almost all of it in the right document; a question
about a name it does not hold leaves that name uncovered in every document.
"""

from __future__ import annotations

import math
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


def content_terms(question: str) -> list[str]:
    words = "".join(c if c.isalnum() else " " for c in question.lower()).split()
    seen: dict[str, None] = {}
    for w in words:
        if w not in STOPWORDS and len(w) > 1:
            seen.setdefault(w, None)
    return list(seen)


def _quoted(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


class Retrieval:
    """Ranking of graftable documents for a question (needs the Library's `_db` and `get`)."""

    def rank_documents(self, question: str, fingerprint: str, limit: int = 4) -> list[Ranked]:
        """Graftable documents and stored prefixes for `question`, best BM25 first, each with its
        coverage. Solutions are left out: they share one template, so a query finds a sibling
        problem's worked solution."""
        terms = content_terms(question)
        if not terms:
            return []
        q = self._db.execute
        rows = q(
            "SELECT e.id, -bm25(entries_fts, 2.0, 1.0, 1.0) FROM entries_fts f JOIN entries e ON e.id = f.rowid "
            f"WHERE entries_fts MATCH ? AND e.kind IN ('document', 'prefix') AND e.fingerprint = ? AND {GRAFTABLE} "
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
            have = [
                t
                for t in terms
                if q(
                    "SELECT 1 FROM entries_fts WHERE rowid = ? AND entries_fts MATCH ?", [entry_id, _quoted(t)]
                ).fetchone()
            ]
            out.append(Ranked(self.get(entry_id), float(score), sum(idf[t] for t in have) / total if total else 0.0))
        return out
