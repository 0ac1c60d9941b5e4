"""Documents in, from anywhere: `kvgraft deposit FILE...` and a file dropped on the window.

A file's identity is its resolved path (under one engine fingerprint, library/sources.py):
- a file that fits the context (leaving ASK_ROOM tokens for a question and its answer) is stored
  verbatim, one entry whose tokens are the file's, so `kvgraft ask --context FILE` grafts it;
- a longer one is split into sections at paragraph boundaries (a paragraph longer than a section at
  sentence ends, then words), each an entry that starts with the document's title and its section
  line ("Section 3 of 12: <markdown heading>"), so an answer can name "doc.md, section 3 of 12";
- re-depositing an unchanged file (the same bytes) computes nothing; a changed file's sections are
  replaced in one transaction, and a section whose text is already stored is not computed again.
A deposit takes the suffixes in DOCUMENT_SUFFIXES only: .txt, .md, .markdown, .rst and .text are read
as UTF-8 (a byte-order mark dropped, line ends made "\n", as `ask --context FILE` reads them); .pdf
through pypdf (its text layer: a scanned PDF has none). Any other file, one without a suffix included
(`/etc/hostname`), is refused unless the caller asks for it as text (`as_text`, `deposit --as-text`):
then it is read as UTF-8 text whatever its suffix.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvgraft.app.core.progress import Progress, no_progress
from kvgraft.app.service import LibraryService
from kvgraft.library.errors import LibraryError

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".rst", ".text")
DOCUMENT_SUFFIXES = TEXT_SUFFIXES + (".pdf",)  # what a deposit takes (any file with as_text)
ASK_ROOM = 256  # tokens left after a stored document for the question suffix and the answer
SECTION_TOKENS = 2048  # a long file's sections hold at most this many tokens (and at most n_ctx - ASK_ROOM)
MAX_FILE_BYTES = 64 * 1024 * 1024

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?\S)(?:\s+#+)?\s*$")  # a markdown ATX heading
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class DocumentError(LibraryError):
    """A file that cannot be deposited as a document (not text, empty, unreadable PDF, wrong type)."""


@dataclass
class FileDeposit:
    """What one file gave: its sections' entries, in order."""

    file: str
    title: str
    entries: list = field(default_factory=list)
    created: list = field(default_factory=list)  # per entry: its state was computed by this deposit
    unchanged: bool = False  # the same bytes were deposited before: nothing was computed
    removed: list = field(default_factory=list)  # entry ids of the old sections that went
    prefill_s: float = 0.0

    @property
    def sectioned(self) -> bool:
        return len(self.entries) > 1

    def entry_dict(self, k: int) -> dict:
        e = self.entries[k]
        return {
            "id": e.id,
            "created": self.created[k],
            "blob_sha256": e.blob_sha256,
            "blob_size": e.blob_size,
            "tokens": e.n_tokens,
            "kind": e.kind,
            "title": e.title,
        }

    def as_dict(self) -> dict:
        """The first (for a file that fits the context: the only) entry's keys, as `kvgraft deposit
        --json` printed them for one text, plus the file, its sections and what changed."""
        out = self.entry_dict(0) | {"prefill_s": round(self.prefill_s, 3)}
        out |= {
            "file": self.file,
            "title": self.title,
            "unchanged": self.unchanged,
            "sections": [self.entry_dict(k) for k in range(len(self.entries))],
            "removed": self.removed,
        }
        return out


def decode_text(raw: bytes, name: str) -> str:
    """A text file's bytes as the library reads every text file (deposit, `ask --context`): UTF-8 with
    an optional byte-order mark, line ends made "\n" as Python's text mode makes them."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if "\x00" in text:
        raise DocumentError(f"{name}: not a text file (it holds NUL bytes)")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_file_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise DocumentError(f"no such file: {path}")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise DocumentError(f"{path.name}: {size / 1e6:,.0f} MB is more than a deposit takes")
    return path.read_bytes()


def check_suffix(path: Path, as_text: bool = False) -> None:
    """DocumentError unless a deposit takes this file: a DOCUMENT_SUFFIXES suffix, or any file `as_text`."""
    suffix = path.suffix.lower()
    if not as_text and suffix not in DOCUMENT_SUFFIXES:
        what = f"a {suffix} file" if suffix else "a file without a suffix"
        raise DocumentError(
            f"{path.name}: kvgraft deposits text ({', '.join(TEXT_SUFFIXES)}) and .pdf files, not {what}; "
            "deposit it with --as-text to read it as UTF-8 text"
        )


def document_text(path: Path, raw: bytes, as_text: bool = False) -> str:
    """The text of a document's bytes (a .pdf's text layer, any other as UTF-8; `as_text`: UTF-8 whatever
    the suffix); DocumentError for a suffix a deposit does not take, or when there is no text to read."""
    check_suffix(path, as_text)
    pdf = path.suffix.lower() == ".pdf" and not as_text
    text = _pdf_text(path.name, raw) if pdf else decode_text(raw, path.name)
    if not text.strip():
        raise DocumentError(f"{path.name}: no text to deposit")
    return text


def read_document(path: Path, as_text: bool = False) -> str:
    """The text of a document file, as a deposit reads it (`ask --context FILE` too, for a PDF)."""
    check_suffix(path, as_text)
    return document_text(path, read_file_bytes(path), as_text)


def read_context_file(path: Path) -> str:
    """A file given as a question's context: a PDF's text layer, any other file as UTF-8 text."""
    if path.suffix.lower() == ".pdf":
        return read_document(path)
    return decode_text(read_file_bytes(path), path.name)


def _pdf_text(name: str, raw: bytes) -> str:
    import pypdf

    try:
        reader = pypdf.PdfReader(io.BytesIO(raw))
        if reader.is_encrypted and reader.decrypt("") == pypdf.PasswordType.NOT_DECRYPTED:
            raise DocumentError(f"{name}: the PDF is encrypted with a password")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except DocumentError:
        raise
    except Exception as exc:  # noqa: BLE001 (an untrusted file: whatever pypdf (or zlib, or a missing codec) raises, it is refused)
        raise DocumentError(f"{name}: not a readable PDF ({type(exc).__name__}: {exc})") from None
    text = "\n\n".join(p for p in pages if p)
    if not text.strip():
        raise DocumentError(f"{name}: the PDF has no text layer (scanned pages are images)")
    return text


def title_of(path: Path, text: str) -> str:
    """A markdown file's first heading, else the first non-empty line (80 characters), else the name."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    if path.suffix.lower() in (".md", ".markdown"):
        for line in lines:
            m = _HEADING.match(line)
            if m:
                return m.group(1)[:80]
    if lines:
        return lines[0][:80] + ("..." if len(lines[0]) > 80 else "")
    return path.name


def _units(model, body: str, budget: int, markdown: bool) -> list[tuple[str | None, str, int, bool, bool]]:
    """(heading in effect, piece, tokens, continues the previous piece's paragraph, opens with a
    heading) for each paragraph, and for the pieces of a paragraph longer than `budget`. Headings are
    markdown's."""
    out: list[tuple[str | None, str, int, bool, bool]] = []
    heading = None
    for para in (p.strip() for p in re.split(r"\n\s*\n", body)):
        if not para:
            continue
        lines = para.splitlines()
        first = _HEADING.match(lines[0]) if markdown else None
        if first:
            heading = first.group(1)
        n = _count(model, para)
        if n <= budget:
            out.append((heading, para, n, False, bool(first)))
        else:
            for k, (piece, m) in enumerate(_pieces(model, para, budget)):
                out.append((heading, piece, m, k > 0, bool(first) and k == 0))
        for line in lines[1:] if markdown else ():  # a heading inside a paragraph holds for what follows it
            m = _HEADING.match(line)
            if m:
                heading = m.group(1)
    return out


def _count(model, text: str) -> int:
    return len(model.tokenize(text, add_bos=False))


def _pieces(model, para: str, budget: int) -> list[tuple[str, int]]:
    """A paragraph longer than `budget` tokens cut into pieces that fit, each with its token count
    (summed from its parts: split_sections checks the whole): at sentence ends, else between words,
    else (a "word" longer than a piece: no spaces, as in CJK text or a data URI) every few characters.
    Each part is tokenized once, so a huge one-line file costs linear time."""
    parts: list[tuple[str, int]] = []
    for sentence in _SENTENCE_END.split(para):
        n = _count(model, sentence)
        if n <= budget:
            parts.append((sentence, n))
            continue
        for word in sentence.split():
            m = _count(model, word)
            if m <= budget:
                parts.append((word, m))
                continue
            step = max(1, budget // 2)  # a token holds at least one character, mostly more
            parts += [(word[i : i + step], _count(model, word[i : i + step])) for i in range(0, len(word), step)]
    pieces, cur, used = [], [], 0
    for text, n in parts:
        if cur and used + n + 1 > budget:
            pieces.append((" ".join(cur), used))
            cur, used = [], 0
        cur.append(text)
        used += n + (1 if len(cur) > 1 else 0)
    if cur:
        pieces.append((" ".join(cur), used))
    return pieces


def split_sections(
    model, title: str, body: str, max_tokens: int, markdown: bool = True
) -> list[tuple[str | None, str, list[int]]]:
    """(heading, text, tokens) of each section of a document too long for one entry: paragraphs packed
    in order into sections of at most `max_tokens` tokens (BOS included), each starting with the title
    and its section line. The tokens are those the fit was checked with (a deposit prefills them)."""
    budget = max_tokens
    header = _count(model, f"{title}\nSection 9999 of 9999: \n\n") + 8
    if header + 64 > max_tokens:
        raise DocumentError(f"{title}: sections of {max_tokens:,} tokens leave no room after the title")
    for _attempt in range(6):
        units = _units(model, body, max(32, budget - header - 64), markdown)
        groups: list[list[tuple[str | None, str, int, bool, bool]]] = []
        used = 0
        heading_cost: dict[str, int] = {}
        for u in units:
            h_cost = heading_cost.setdefault(u[0], _count(model, u[0])) if u[0] else 0
            # a heading starts a new section once the current one is half full, so sections follow chapters
            fits = used + u[2] + 2 + header <= budget and not (u[4] and used + header >= budget // 2)
            if groups and fits:
                groups[-1].append(u)
                used += u[2] + 2
            else:
                groups.append([u])
                used = u[2] + 2 + h_cost
        n = len(groups)
        sections = []
        for k, g in enumerate(groups, start=1):
            heading = g[0][0]
            body_k = g[0][1]
            for _h, piece, _n, cont, _starts in g[1:]:
                body_k += (" " if cont else "\n\n") + piece
            if heading == title:  # the document's own title as its first heading: not said twice
                heading = None
            line = f"Section {k} of {n}" + (f": {heading}" if heading else "")
            text = f"{title}\n{line}\n\n{body_k}"
            sections.append((heading, text, model.tokenize(text)))
        if all(len(tokens) <= max_tokens for _h, _t, tokens in sections):
            return sections
        budget = int(budget * 0.9)  # the estimate was short (tokens merge across joins): pack tighter
    raise DocumentError(f"{title}: could not split it into sections of at most {max_tokens:,} tokens")


def deposit_file(
    service: LibraryService,
    path: Path | str,
    *,
    title: str | None = None,
    section_tokens: int = SECTION_TOKENS,
    progress: Progress = no_progress,
    as_text: bool = False,
) -> FileDeposit:
    """Deposit one document file (DOCUMENT_SUFFIXES; any file read as UTF-8 text with `as_text`):
    verbatim if it fits, else in sections. `progress(stage, done, total)` hears of each section's
    prefill; raising Cancelled from it stops the deposit with nothing changed."""
    engine, lib = service.engine, service.library
    p = Path(path).expanduser().resolve()
    check_suffix(p, as_text)  # before a byte is read: a system file is not read at all
    raw = read_file_bytes(p)  # read once: the text and the file's identity come from the same bytes
    file_sha = hashlib.sha256(raw).hexdigest()
    fit = engine.config.n_ctx - ASK_ROOM
    if fit < 64:
        raise DocumentError(f"a context of {engine.config.n_ctx:,} tokens leaves no room for a document")
    budget = min(fit, section_tokens)
    same = lib.sources.unchanged_source(str(p), engine.fingerprint, file_sha, budget, fit)
    if same is not None and (title is None or title == same[0].title):
        src, entries = same
        return FileDeposit(str(p), src.title, entries, [False] * len(entries), unchanged=True)
    text = document_text(p, raw, as_text)
    doc_title = title or title_of(p, text)
    tokens = engine.model.tokenize(text)
    if len(tokens) <= fit:
        sections = [(None, text, tokens)]
    else:
        progress(f"{p.name}: splitting", 0, 1)
        markdown = p.suffix.lower() in (".md", ".markdown")
        sections = split_sections(engine.model, doc_title, text, budget, markdown)
    n = len(sections)
    out = FileDeposit(str(p), doc_title)
    with lib.sources.source_update(str(p), engine.fingerprint) as update:
        for k, (heading, stext, stoks) in enumerate(sections, start=1):
            entry_title = (
                doc_title if n == 1 else f"{doc_title}, section {k} of {n}" + (f": {heading}" if heading else "")
            )
            stored = update.stored(stoks)
            if stored is not None:
                out.created.append(update.add(heading, existing=stored, title=entry_title))
            else:
                stage = p.name if n == 1 else f"{p.name}: section {k}/{n}"
                entry, prefill_s = service.document_state(
                    stext, stoks, entry_title, on_progress=lambda d, t, s=stage: progress(s, d, t)
                )
                entry.pop("title")
                out.created.append(update.add(heading, title=entry_title, **entry))
                out.prefill_s += prefill_s
            progress(f"{p.name}: sections", k, n)
        out.entries, out.removed = update.commit(file_sha, doc_title, budget if len(tokens) > fit else None)
    return out
