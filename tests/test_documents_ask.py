"""`kvgraft ask` without --context answers a question about a deposited file from it, naming it: the
real Gemma 3 270M, the real CLI, a real index (the model cannot know the invented names otherwise)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import kvgraft.app.cli.common as common
from kvgraft.app.core.textgen import synthetic_text
from kvgraft.entry import cli


@pytest.fixture
def shared_engine(engine, monkeypatch):
    monkeypatch.setattr(common, "open_engine", lambda settings, on_progress=None: engine)
    return engine


def test_ask_answers_from_a_deposited_file_and_names_it(shared_engine, tmp_path):
    doc = tmp_path / "runrenlys.md"
    doc.write_text(
        "# Survey notes on Runrenlys\n\n"
        + synthetic_text(260, 41)
        + "\n\nThe head brewer of Runrenlys is Kolys Feosdor.\n\n"
        + synthetic_text(260, 42)
        + "\n"
    )
    other = tmp_path / "belvelthu.txt"
    other.write_text(
        "Survey notes on Belvelthu\n\n" + synthetic_text(300, 43) + "\n\nThe town of Belvelthu was founded in 1433.\n"
    )
    runner = CliRunner()
    dep = runner.invoke(cli, ["deposit", str(doc), str(other), "--json"])
    assert dep.exit_code == 0, dep.output
    ids = [d["id"] for d in json.loads(dep.stdout)["deposited"]]
    res = runner.invoke(cli, ["ask", "Who is the head brewer of Runrenlys?", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert (r["source"], r["entry_id"], r["title"]) == ("retrieved", ids[0], "Survey notes on Runrenlys")
    assert r["section"]["file"] == str(doc.resolve()) and r["section"]["sections"] == 1
    assert "Feosdor" in r["answer"]
    words = runner.invoke(cli, ["ask", "Who is the head brewer of Runrenlys?"])
    assert words.exit_code == 0 and "Feosdor" in words.stdout
    assert f'document #{ids[0]} "Survey notes on Runrenlys" in runrenlys.md (retrieved' in words.output
    fresh = runner.invoke(cli, ["ask", "Who is the head brewer of Runrenlys?", "--no-library", "--json"])
    assert json.loads(fresh.stdout)["source"] == "fresh"
