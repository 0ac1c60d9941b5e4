"""Does asking llama.cpp for the logits at every position change the bits? And what does it cost?

    python scripts/scored_prefill_bits.py

For a document prefix of several lengths, a 20-token question is decoded after it twice in the same
call: once as `Session.prefill` does (logits at the last position only), once as
`Session.prefill_scored` does (logits at every position). Prints, per length, whether the logits
after the question and the canonical snapshot SHA-256 are equal, and both calls' times (medians).
If they are equal, the scoring pass can be the answer's own prefill; if not, the answer must be
prefilled again in its own schedule.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvgraft.app.core.runtime import Settings, open_engine  # noqa: E402
from kvgraft.app.core.textgen import prefix_tokens  # noqa: E402
from kvgraft.engine.compare import logits_sha256  # noqa: E402


def run(engine, prefix, question, scored: bool):
    with engine.session() as s:
        s.prefill(prefix)
        t0 = time.perf_counter()
        if scored:
            s.prefill_scored(question)
        else:
            s.prefill(question)
        dt = time.perf_counter() - t0
        return logits_sha256(s.logits()), s.snapshot().sha256, dt


def main() -> int:
    engine = open_engine(Settings())
    question = engine.model.tokenize(" Question: when was the town first recorded in the old books? Answer:", False)
    question = question[:20]
    print(f"| prefix tokens | logits equal | snapshot equal | prefill {len(question)} tokens | scored prefill |")
    print("| --- | --- | --- | --- | --- |")
    for n in (20, 300, 600, 1500):
        prefix = prefix_tokens(engine.model, n, seed=5)
        plain = [run(engine, prefix, question, False) for _ in range(3)]
        scored = [run(engine, prefix, question, True) for _ in range(3)]
        t_plain = statistics.median(p[2] for p in plain) * 1e3
        t_scored = statistics.median(p[2] for p in scored) * 1e3
        same_logits, same_snap = plain[0][0] == scored[0][0], plain[0][1] == scored[0][1]
        print(f"| {n} | {same_logits} | {same_snap} | {t_plain:.0f} ms | {t_scored:.0f} ms |")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
