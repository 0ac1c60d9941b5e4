"""Conversations that resume exactly: threads whose states are stored as `session` entries.

After each reply the state of the whole transcript (what the KV holds: the prompt segments and
the reply tokens that were decoded) is stored as a content-addressed `session` entry, with the
decode schedule that made it. Sending a message grafts the latest stored state and prefills only the
new message's segment. "Exact" means: the logits before the reply are SHA-256-equal to a fresh run of
the thread's tokens in a new context, as if the thread had never stopped (`say(check=True)`,
`check_turn`). On a batch-invariant engine (`Engine.batch_invariant`) that fresh run is one prefill of
the tokens and no call sizes are recorded; where the engine's bits depend on the batching, the schedule
is the first segment in chunks of n_batch, then one call per later segment and one call per decoded
reply token (or prompt lookup's verify calls), and the fresh run replays it (../shared/FINDINGS.md).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from kvgraft.app.answer.stream import TextFn, TextStream
from kvgraft.app.proof.chat_format import ChatFormat
from kvgraft.app.proof.receipt import SESSION_PROBE, Receipt
from kvgraft.app.proof.replay import decode_in_calls, engine_for, prefill_in_schedule, schedule_of
from kvgraft.app.service import LibraryService, model_record
from kvgraft.engine.compare import logits_sha256
from kvgraft.engine.errors import EngineError
from kvgraft.engine.lookup_decode import call_size
from kvgraft.engine.sampling import Sampler, SamplingParams
from kvgraft.library.records import LOCAL, Entry
from kvgraft.library.threads import Thread, Turn

DEFAULT_MAX_TOKENS = 128
REGENERATE_TEMPERATURE = 0.8  # Regenerate samples: greedy would give the same reply again


def regenerate_sampling(seed: int) -> SamplingParams:
    return SamplingParams(temperature=REGENERATE_TEMPERATURE, seed=seed)


class ChatError(EngineError):
    """A thread that cannot go on here (another engine, a full context, a schedule this engine lacks)."""


@dataclass
class SayResult:
    thread: int
    turn: int
    reply: str
    tokens_restored: int  # grafted from the stored state
    tokens_prefilled: int  # computed for this message
    tokens_decoded: int  # reply tokens decoded into the KV
    resume_ms: float  # the graft: read, validate, restore
    prefill_ms: float  # the new message's tokens
    exact: bool | None  # None unless check=True compared with a replay of the thread's schedule
    replay_ms: float | None  # check=True: the replay, i.e. what recomputing the transcript from scratch costs
    logits_sha256: str  # the logits before the reply
    entry_id: int  # the session entry holding the state after the reply
    tokens: int  # the transcript's length after the reply
    stop_reason: str
    fallback: bool  # the template was not prefix-stable: the conversation was rendered again
    decode_ms: float = 0.0
    decode_calls: int = 0  # llama_decode calls of the reply (fewer than tokens decoded: prompt lookup)

    def as_dict(self) -> dict:
        return asdict(self)


class ChatService:
    def __init__(self, service: LibraryService) -> None:
        self.service = service
        self.library = service.library
        self.engine = service.engine

    @property
    def format(self) -> ChatFormat:
        return ChatFormat.for_model(self.engine.model)

    # -- threads ------------------------------------------------------------------------------
    def new_thread(self, system: str | None = None, from_entry: int | None = None, title: str | None = None) -> Thread:
        if from_entry is not None:
            entry = self.library.get(from_entry)
            if entry.kind in ("answer", "session"):
                raise ChatError(f"entry #{from_entry} is a{'n' if entry.kind == 'answer' else ''} {entry.kind} state")
            if not entry.graftable(self.engine.fingerprint):
                raise ChatError(
                    f"entry #{from_entry} cannot be grafted by this engine (another fingerprint, damaged, or unproven)"
                )
        return self.library.threads.create_thread(
            format=self.format.name,
            fingerprint=self.engine.fingerprint,
            model_sha256=self.engine.model.info.sha256,
            title=title,
            system=system or None,
            from_entry_id=from_entry,
        )

    def fork(self, thread_id: int, turn: int) -> Thread:
        return self.library.threads.fork_thread(thread_id, turn)

    def remove(self, thread_id: int) -> Thread:
        return self.library.threads.remove_thread(thread_id)

    # -- a message ----------------------------------------------------------------------------
    def _check_engine(self, thread: Thread) -> None:
        if thread.fingerprint != self.engine.fingerprint:
            raise ChatError(
                f"thread #{thread.id} was made under another engine fingerprint (model, flash attention, KV "
                "types or backend differ): open it with the settings it was made with"
            )
        if thread.format != self.format.name:
            raise ChatError(f"thread #{thread.id} uses prompt format {thread.format}, this model {self.format.name}")

    def _sources(self, thread: Thread, turns: list[Turn]) -> list[tuple[list[int], dict, Entry]]:
        """Stored states the thread may resume from, newest first: (tokens, schedule, entry)."""
        kept = self.library.threads.existing_entries([t.entry_id for t in turns])  # gc removes older states
        out = [(t.tokens, t.schedule, kept[t.entry_id]) for t in reversed(turns) if t.entry_id in kept]
        if thread.from_entry_id is not None:
            base = self.library.get(thread.from_entry_id)
            out.append((base.tokens, base.schedule or schedule_of(self.engine), base))
        return out

    def say(
        self,
        thread_id: int,
        message: str,
        check: bool = False,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        on_text: TextFn | None = None,
        sampling: SamplingParams | None = None,
        regenerated: bool = False,
    ) -> SayResult:
        """Reply to `message` in the thread; `on_text` receives the reply as decoded, in pieces that add up
        to `SayResult.reply` (app/answer/stream.py); raising Cancelled stops it (the part decoded is kept).
        `sampling` (Regenerate) picks the reply's tokens; the schedule, and so the state's bits for those
        tokens, does not depend on how they were picked."""
        if not message.strip():
            raise ChatError("the message is empty")
        thread = self.library.threads.thread(thread_id)
        self._check_engine(thread)
        turns = self.library.threads.turns(thread_id)
        history = [(t.user, t.reply) for t in turns]
        sources = self._sources(thread, turns)
        fmt, model = self.format, self.engine.model
        fallback = False
        if turns:
            seg = fmt.next(model, thread.system, history, message)
            if seg is None:  # a template that rewrites earlier turns: render it all, graft the longest prefix
                fallback = True
                base = self.library.get(thread.from_entry_id).tokens if thread.from_entry_id else []
                target = base + fmt.full(model, thread.system, history, message, after_state=bool(base))
            else:
                target = turns[-1].tokens + seg
        else:
            base = sources[0][0] if sources else []
            target = base + fmt.first(model, thread.system, message, after_state=bool(base))
        source = next((s for s in sources if len(s[0]) < len(target) and target[: len(s[0])] == s[0]), None)
        n_ctx = self.engine.config.n_ctx
        if len(target) + max_tokens > n_ctx:
            raise ChatError(
                f"thread #{thread_id} would hold {len(target):,} tokens plus a reply of up to {max_tokens}; this "
                f"context holds {n_ctx:,}: start a new thread, or fork an earlier turn (kvgraft chat fork)"
            )
        invariant = self.engine.batch_invariant  # then no call sizes are recorded or replayed: none decides the bits
        schedule = dict(source[1]) if source and not invariant else schedule_of(self.engine)
        if (schedule["n_batch"], schedule["n_ubatch"]) != (self.engine.config.n_batch, self.engine.config.n_ubatch):
            raise ChatError(
                f"thread #{thread_id} was decoded with --batch-size {schedule['n_batch']} --ubatch-size "
                f"{schedule['n_ubatch']}: resume it with the same (the batch shape decides the bits)"
            )
        _ = self.engine.layout  # the state layout is probed once per engine: not part of a resume's time
        with self.service.session() as s:
            resume_ms = 0.0
            if source is not None:
                resume_ms = self.service.graft(s, source[2]).total_ms
            rest = target[len(source[0]) :] if source else target
            t0 = time.perf_counter()
            s.prefill(rest)
            prefill_ms = (time.perf_counter() - t0) * 1e3
            before = logits_sha256(s.logits())
            stream = TextStream(model, on_text, fmt.stops, strip=False)
            sampler = Sampler(sampling) if sampling is not None and not sampling.greedy else None
            gen = s.generate(max_tokens, stop=fmt.stops, on_token=stream.on_token, sampler=sampler)
            stream.finish(gen.text)
            kv = list(s.tokens)
            snap = s.snapshot()
        calls = list(schedule.get("then", []))
        if source is not None and not invariant:
            calls.append(len(rest))
        before_schedule = {**schedule, "then": calls} if calls else {k: v for k, v in schedule.items() if k != "then"}
        decoded = len(kv) - len(target)
        calls = calls + ([] if invariant else gen.calls)  # one per decode call of the reply: 1, or a verify call
        after_schedule = {**schedule, "then": calls} if calls else before_schedule
        entry, _ = self.library.add_entry(
            kind="session",
            text=model.detokenize(kv),
            tokens=kv,
            blob=snap.data,
            blob_sha256=snap.sha256,
            fingerprint=self.engine.fingerprint,
            model=model_record(self.engine),
            title=f"thread #{thread_id}: {(thread.title or message)[:60]}",
            receipt=Receipt.fresh(SESSION_PROBE, rest, before, computed="chat", format=fmt.name).as_dict(),
            elided=snap.elided,
            proof=LOCAL,
            schedule=after_schedule,
        )
        turn = self.library.threads.add_turn(
            thread_id,
            user=message,
            reply=gen.text,
            tokens=kv,
            entry_id=entry.id,
            schedule=after_schedule,
            logits_sha256=before,
            stats={
                "decoded": decoded,
                "restored": len(source[0]) if source else 0,
                "prefilled": len(rest),
                "resume_ms": round(resume_ms, 3),
                "prefill_ms": round(prefill_ms, 3),
                "decode_ms": round(gen.seconds * 1e3, 3),
                "stop_reason": gen.stop_reason or "",
                "regenerated": int(regenerated),
            },
        )
        exact = replay_ms = None
        if check:
            t0 = time.perf_counter()
            exact = self.replay_matches(target, before_schedule, before)
            replay_ms = round((time.perf_counter() - t0) * 1e3, 3)
            self.library.threads.set_turn_checked(thread_id, turn.n, exact)
        return SayResult(
            thread=thread_id,
            turn=turn.n,
            reply=gen.text,
            tokens_restored=len(source[0]) if source else 0,
            tokens_prefilled=len(rest),
            tokens_decoded=decoded,
            resume_ms=round(resume_ms, 3),
            prefill_ms=round(prefill_ms, 3),
            exact=exact,
            replay_ms=replay_ms,
            logits_sha256=before,
            entry_id=entry.id,
            tokens=len(kv),
            stop_reason=gen.stop_reason or "",
            fallback=fallback,
            decode_ms=round(gen.seconds * 1e3, 3),
            decode_calls=len(gen.calls),
        )

    def regenerate(
        self,
        thread_id: int,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        on_text: TextFn | None = None,
        sampling: SamplingParams | None = None,
    ) -> SayResult:
        """Take back the thread's last turn and answer its message again (from the state before it)."""
        thread = self.library.threads.thread(thread_id)
        self._check_engine(thread)
        last = self.library.threads.drop_last_turn(thread_id)
        return self.say(
            thread_id, last.user, max_tokens=max_tokens, on_text=on_text, sampling=sampling, regenerated=True
        )

    def check_turn(self, thread_id: int, n: int) -> dict:
        """Compute turn `n` in a new context (in the schedule it was decoded in, where the batching decides the
        bits; one prefill on a batch-invariant engine): are the logits before its reply
        the same bits, and is the stored state after it byte-equal to the replay's? Records the result."""
        thread = self.library.threads.thread(thread_id)
        self._check_engine(thread)
        turns = self.library.threads.turns(thread_id)
        if not 1 <= n <= len(turns):
            raise ChatError(f"thread #{thread_id} has no turn {n} (it has {len(turns)})")
        turn = turns[n - 1]
        if turn.decoded is None:
            raise ChatError(f"turn {n} was made before kvgraft recorded how many reply tokens it decoded")
        tokens, calls, cut, before_schedule = turn.tokens, [], 0, {}
        if not self.engine.batch_invariant:  # else one fresh prefill of the tokens: no call sizes decide the bits
            calls = list(turn.schedule.get("then", []))
            cut = reply_calls_start(calls, turn.decoded)
            before_schedule = {k: v for k, v in turn.schedule.items() if k != "then"}
            if calls[:cut]:
                before_schedule["then"] = calls[:cut]
        before = tokens[: len(tokens) - turn.decoded]
        t0 = time.perf_counter()
        eng = engine_for(self.engine, turn.schedule)
        with eng.session() as fresh:
            prefill_in_schedule(fresh, before, before_schedule)
            logits_equal = logits_sha256(fresh.logits()) == turn.logits_sha256
            if turn.decoded:
                decode_in_calls(fresh, tokens[len(before) :], calls[cut:])
            state = fresh.snapshot()
        stored = self.library.threads.existing_entries([turn.entry_id]).get(turn.entry_id)
        state_equal = None if stored is None else state.sha256 == stored.blob_sha256
        exact = logits_equal and state_equal is not False
        self.library.threads.set_turn_checked(thread_id, n, exact)
        return {
            "thread": thread_id,
            "turn": n,
            "exact": exact,
            "logits_equal": logits_equal,
            "state_equal": state_equal,  # None: gc removed this turn's state (a later one is kept)
            "tokens": len(tokens),
            "replay_ms": round((time.perf_counter() - t0) * 1e3, 3),
        }

    def replay_matches(self, tokens: list[int], schedule: dict, logits_sha: str) -> bool:
        """Decode `tokens` in `schedule` in a new context: are the logits the same bits?"""
        eng = engine_for(self.engine, schedule)
        with eng.session() as fresh:
            prefill_in_schedule(fresh, tokens, schedule)
            return logits_sha256(fresh.logits()) == logits_sha


def thread_view(library, thread_id: int) -> dict:
    """A thread and its turns (token counts, the state's address), JSON-ready: `kvgraft chat show`."""
    thread = library.threads.thread(thread_id)
    turns = library.threads.turns(thread_id)
    states = library.threads.existing_entries([t.entry_id for t in turns])
    out = thread.as_dict()
    out["turns"] = [
        {
            "n": t.n,
            "user": t.user,
            "reply": t.reply,
            "tokens": t.n_tokens,
            "entry_id": t.entry_id,
            "blob_sha256": states[t.entry_id].blob_sha256 if t.entry_id in states else None,  # None: gc took it
            "logits_sha256": t.logits_sha256,
            "created_at": t.created_at,
        }
        for t in turns
    ]
    return out


def thread_listing(library) -> list[dict]:
    """Every thread: turns, transcript tokens, session bytes (`kvgraft chat list`)."""
    sizes = library.threads.session_bytes_by_thread()
    out = []
    for th in library.threads.list():
        turns = library.threads.turns(th.id)
        out.append(
            {
                "thread": th.id,
                "title": th.title,
                "turns": len(turns),
                "tokens": turns[-1].n_tokens if turns else 0,
                "session_bytes": sizes.get(th.id, 0),
                "forked_from": th.forked_from,
                "created_at": th.created_at,
            }
        )
    return out


def reply_calls_start(calls: list, decoded: int) -> int:
    """Where a turn's reply calls begin in its schedule's `then`: the last calls that decoded `decoded` tokens."""
    n, i = 0, len(calls)
    while n < decoded and i > 0:
        i -= 1
        n += call_size(calls[i])
    if n != decoded:
        raise ChatError(f"the turn's recorded calls do not end with the {decoded} tokens of its reply")
    return i
