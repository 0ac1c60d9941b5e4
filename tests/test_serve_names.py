"""`/v1/models` names the model as users pass it to `--model`: a known model's name, not its file's."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from kvgraft.app.core import model_registry as reg
from kvgraft.app.serve.http import Server, ServerConfig


def _server(path):
    engine = SimpleNamespace(model=SimpleNamespace(info=SimpleNamespace(path=str(path))))  # plumbing only
    return Server(SimpleNamespace(service=SimpleNamespace(engine=engine)), ServerConfig())


def test_a_known_models_file_is_served_under_its_name(tmp_path, monkeypatch):
    monkeypatch.setenv("KVGRAFT_MODEL_DIR", str(tmp_path))
    known = replace(next(iter(reg.KNOWN.values())), name="coder-test", file_name="coder-test-q6_k.gguf")
    monkeypatch.setitem(reg.KNOWN, known.name, known)
    reg.target_path(known).parent.mkdir(parents=True, exist_ok=True)
    reg.target_path(known).write_bytes(b"GGUF")
    assert _server(reg.target_path(known)).model_id == "coder-test"
    other = tmp_path / "elsewhere" / "my-model.gguf"
    assert _server(other).model_id == "my-model"
