"""docs/architecture.md is the map: every module of engine/, library/, app/ and ui/ is named on it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_module_is_on_the_map():
    doc = (REPO / "docs" / "architecture.md").read_text()
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_/]+/)` \|.*$", doc, re.M)}
    missing = []
    for top in ("engine", "library", "app", "ui"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if path.name == "__init__.py" or "__pycache__" in rel:
                continue
            folder = rel.rsplit("/", 1)[0] + "/"
            named = f"`{rel}`" in doc or f"`{path.name}`" in rows.get(folder, "")
            if not named:
                missing.append(rel)
    assert not missing, f"modules not on docs/architecture.md's map: {missing}"
    assert not (REPO / "docs" / "layout.md").exists(), "one map: docs/layout.md is folded into architecture.md"
