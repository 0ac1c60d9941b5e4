"""What a grammar costs per token: llguidance's mask on the model's whole vocabulary, beside a decode step.

    python scripts/bench_constraint.py [--model embedded] [--model qwen2.5-coder-1.5b] [--tokens 48]

For each model: the one-time build of llguidance's view of the vocabulary, a JSON schema's compile, and
over one constrained answer (a JSON array of small integers: a long answer whose every step is masked)
the mean time per token of the mask (computing it, applying it to a copy of the logits) and of the
whole step (mask, choice, decode), beside the same prompt's unconstrained steps.
"""

from __future__ import annotations

import argparse
import time

from kvgraft.app.core.runtime import Settings, open_engine
from kvgraft.engine.constraint import Grammar, vocabulary

SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 200}
PROMPT = "List the numbers of the piers, as a JSON array: "


def bench(model_name: str, n: int) -> dict:
    settings = Settings() if model_name == "embedded" else Settings(model=model_name)
    engine = open_engine(settings, on_progress=lambda *_: None)
    m = engine.model
    try:
        t = time.perf_counter()
        vocabulary(m)
        vocab_s = time.perf_counter() - t
        t = time.perf_counter()
        grammar = Grammar.json_schema(m, SCHEMA)
        compile_ms = (time.perf_counter() - t) * 1e3
        prompt = m.tokenize(PROMPT, True)
        rows = {}
        for label in ("plain", "constrained"):
            s = engine.session()
            try:
                s.prefill(prompt)
                c = grammar.matcher() if label == "constrained" else None
                mask = [0.0]
                if c is not None:
                    allowed = c.allowed

                    def timed(logits, allowed=allowed, mask=mask):
                        t0 = time.perf_counter()
                        out = allowed(logits)
                        mask[0] += time.perf_counter() - t0
                        return out

                    c.allowed = timed
                t = time.perf_counter()
                gen = s.generate(n, stop_at_eog=False, lookup=0, constraint=c)
                rows[label] = ((time.perf_counter() - t) / len(gen.tokens) * 1e3, mask[0] / len(gen.tokens) * 1e3)
            finally:
                s.close()
        return {
            "model": m.info.name,
            "vocab": m.info.n_vocab,
            "vocab_s": vocab_s,
            "compile_ms": compile_ms,
            "plain_ms": rows["plain"][0],
            "step_ms": rows["constrained"][0],
            "mask_ms": rows["constrained"][1],
        }
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="embedded, a known model or a GGUF (repeatable)")
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    print(
        "| model | vocabulary | vocabulary view, once | schema compile | mask per token | "
        "constrained step | plain step | mask share of a step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.model or ["embedded"]:
        r = bench(name, args.tokens)
        print(
            f"| {r['model']} | {r['vocab']:,} | {r['vocab_s']:.2f} s | {r['compile_ms']:.1f} ms | "
            f"{r['mask_ms']:.3f} ms | {r['step_ms']:.1f} ms | {r['plain_ms']:.1f} ms | "
            f"{r['mask_ms'] / r['step_ms']:.1%} |"
        )


if __name__ == "__main__":
    main()
