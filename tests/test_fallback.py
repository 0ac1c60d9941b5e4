"""The fallback for an engine whose bits depend on the batching, in a process with invariance switched off.

kvgraft's build makes llama.cpp's bits independent of how tokens are batched, and its probe checks it
(engine/invariance.py). Where the probe finds otherwise (another build, a GPU backend) or the user sets
KVGRAFT_BATCH_INVARIANT=0, every exact path keeps its recorded schedules: the server decodes each request
in aligned blocks and reuses states only at that schedule's boundaries, a conversation records its call
sizes and "Check this turn" replays them, a lookup-decoded reply is replayed in its verify calls. This
runs them in a subprocess with KVGRAFT_BATCH_INVARIANT=0 (llama.cpp's own row-count switches) and checks
each against a cold run in its own schedule.
"""

from __future__ import annotations

from tests.fallback_process import run_without_invariance

FALLBACK = """
import json, sys, tempfile
from pathlib import Path
from kvgraft.app.answer.chat import ChatService
from kvgraft.app.core.model_store import embedded_model_path, model_sha256
from kvgraft.app.serve.prompt_cache import PromptCache
from kvgraft.app.serve.schedule import calls_from
from kvgraft.app.service import LibraryService, open_library
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.config import EngineConfig
from kvgraft.engine.engine import Engine

path = embedded_model_path()
eng = Engine.load(EngineConfig(model_path=path, n_ctx=2048, lookup=8), model_sha256(path))
text = "The harbor of Paquka opens at dawn. The red boats leave first, then the blue ones. " * 8
out = {"invariant": eng.batch_invariant}

def aligned_cold(tokens):
    with eng.session() as s:
        at = 0
        for c in calls_from(0, len(tokens)):
            s.prefill(tokens[at : at + c])
            at += c
        return logits_sha256(s.logits())

with open_library(Path(sys.argv[1])) as lib, LibraryService(eng, lib) as service:
    cache = PromptCache(service, 10**10)
    p1 = eng.model.tokenize(text + "Question: which boats leave first? Answer:")
    p2 = eng.model.tokenize(text + "Question: when does the harbor open? Answer:")
    first = cache.prepare(p1)
    out["cold"] = [first.source, logits_sha256(cache.session.logits()) == aligned_cold(p1), first.stores_queued]
    warm = cache.prepare(p2)
    out["warm"] = [warm.source, warm.cached_tokens, logits_sha256(cache.session.logits()) == aligned_cold(p2)]
    cache.flush()
    cache.close_session()
    again = cache.prepare(p1)
    out["library"] = [again.source, again.cached_tokens, logits_sha256(cache.session.logits()) == aligned_cold(p1)]
    cache.close_session()
    chats = ChatService(service)
    t = chats.new_thread(system=text)
    a = chats.say(t.id, "Repeat the first sentence word for word.", max_tokens=16, check=True)
    b = chats.say(t.id, "Which boats leave first?", max_tokens=8, check=True)
    turn = lib.threads.turns(t.id)[0]
    out["chat"] = {
        "exact": [a.exact, b.exact, chats.check_turn(t.id, 1)["exact"], chats.check_turn(t.id, 2)["exact"]],
        "calls": turn.schedule.get("then", []),
        "decode_calls": a.decode_calls,
        "decoded": a.tokens_decoded,
    }
print(json.dumps(out))
"""


def test_with_invariance_switched_off_every_exact_path_keeps_its_schedules(tmp_path):
    out = run_without_invariance(FALLBACK, str(tmp_path / "home"))
    # the server: aligned blocks, reused only at a boundary of the request's schedule, the cold bits each time
    source, equal, stored = out["cold"]
    assert source == "cold" and equal and stored and all(p % 64 == 0 or p == max(stored) for p in stored)
    source, cached, equal = out["warm"]
    assert source == "warm" and cached % 64 == 0 and cached > 0 and equal
    source, cached, equal = out["library"]
    assert source == "library" and equal
    # a conversation records its calls (one per token, or lookup's verify calls) and its checks replay them
    chat = out["chat"]
    assert chat["exact"] == [True, True, True, True]
    assert chat["calls"] and sum(c if isinstance(c, int) else c["kept"] for c in chat["calls"]) >= chat["decoded"]
