"""The README's client example: a long system prompt and a question, asked of a running `kvgraft serve`.

    python scripts/serve_example.py [--url http://127.0.0.1:8080/v1]

Run it, stop the server (Ctrl-C) and start it again, and run it once more: the second run's prompt
is grafted from the library ("source": "library") and its logprobs equal the first, cold run's
(the script keeps the first run's in a file beside it, in the temp dir, to compare).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from openai import OpenAI

SYSTEM = (
    "You answer questions about the harbor of Paquka. The harbor opens at dawn. Fishing boats leave in a "
    "fixed order: the red ones first, then the blue ones, and the small white skiffs last. The harbor master, "
    "Ilse Varro, writes each departure in a ledger kept in the stone tower. "
) * 12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="unused")
    args = ap.parse_args()
    client = OpenAI(base_url=args.url, api_key=args.api_key)
    r = client.chat.completions.create(
        model="gemma-3-270m-q4_k_m",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Who writes the ledger?"}],
        max_tokens=16,
        logprobs=True,
    )
    kv = r.model_extra["kvgraft"]
    print("answer:", r.choices[0].message.content)
    print(f"prompt tokens: {r.usage.prompt_tokens}, cached: {r.usage.prompt_tokens_details.cached_tokens}")
    print(
        f"kvgraft: source {kv['source']}, entry {kv['entry_id']}, proof {kv['proof']}, "
        f"{kv['tokens_restored']} tokens restored in {kv['graft_ms']:.0f} ms, {kv['tokens_prefilled']} prefilled "
        f"in {kv['prefill_ms']:.0f} ms"
    )
    lps = [t.logprob for t in r.choices[0].logprobs.content]
    first = Path(tempfile.gettempdir()) / "kvgraft-serve-example.json"
    if first.exists():
        print("logprobs equal to the first run's:", json.loads(first.read_text()) == lps)
    else:
        first.write_text(json.dumps(lps))
        print(f"logprobs kept in {first} for the next run")


if __name__ == "__main__":
    main()
