"""Two `kvgraft serve --remote team` processes with their own data dirs sharing one bucket (SeaweedFS), driven
by the official `openai` client: a prompt instance A computed is answered by instance B from the fleet's
shared cache (its `kvgraft` object says `remote:team`), with A's cold logprobs bit for bit."""

from __future__ import annotations

import re
import time
import uuid

import httpx
import openai
from click.testing import CliRunner

from kvgraft.app.core.textgen import synthetic_text
from kvgraft.entry import cli
from kvgraft.library.signing import generate_key
from tests.serve_fixture import ServerProcess

SYSTEM = "You answer from these notes.\n\n" + synthetic_text(420, seed=71)


def kv(home, *args):
    r = CliRunner().invoke(cli, ["--home", str(home), *args])
    assert r.exit_code == 0, r.output
    return r


def metric(srv: ServerProcess, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    m = re.search(rf"^{name}_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def ask(srv: ServerProcess):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    return c.chat.completions.create(
        model="any",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What do the notes say?"}],
        max_tokens=8,
        logprobs=True,
    )


def test_instance_b_answers_from_what_instance_a_computed(s3_env, tmp_path):
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_env.make_bucket(bucket)
    signer = generate_key(tmp_path / "fleet.key")
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        kv(home, "remote", "add", "team", f"s3://{bucket}/fleet", "--endpoint-url", s3_env.endpoint)
        kv(home, "keys", "trust", signer.public_key_b64, "--name", "fleet")
    args = ("--remote", "team", "--sign", str(tmp_path / "fleet.key"), "--cache-budget", "1G")
    a = ServerProcess(homes[0], *args).start()
    try:
        cold = ask(a)
        assert cold.model_extra["kvgraft"]["source"] == "cold"
        end = time.monotonic() + 60
        while metric(a, "kvgraft_remote_uploaded") < 1 and time.monotonic() < end:
            time.sleep(0.2)  # A stores the state in idle time, then uploads it
        assert metric(a, "kvgraft_remote_uploaded") >= 1
    finally:
        a.stop()
    b = ServerProcess(homes[1], *args).start()
    try:
        warm = ask(b)
        hits = metric(b, "kvgraft_remote_hits")
    finally:
        b.stop()
    kvg = warm.model_extra["kvgraft"]
    assert kvg["source"] == "remote:team" and kvg["remote_fetch_ms"] > 0 and kvg["cached_tokens"] > 0, kvg
    assert hits == 1
    assert [t.logprob for t in warm.choices[0].logprobs.content] == [
        t.logprob for t in cold.choices[0].logprobs.content
    ]
    assert warm.choices[0].message.content == cold.choices[0].message.content
