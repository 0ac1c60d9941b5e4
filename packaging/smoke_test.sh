#!/usr/bin/env bash
# Smoke test of the bundle: --version, doctor --json, and one `ask` answered from a tiny pack
# (unsigned, so replayed on import: proof `replayed`, its answer stated by the pack, not vouched).
# Runs headless with its own data dir and model cache, so the model comes from the bundle's data
# (the first command assembles it into the empty cache).
#
#   packaging/smoke_test.sh [BIN]                      natively
#   RUNNER="packaging/run_emulated.sh SandyBridge" EXPECT_VARIANT=sandybridge packaging/smoke_test.sh BIN
#
# RUNNER: a command prefix the binary runs under; EXPECT_VARIANT: the llama.cpp CPU variant doctor must
# report (it proves the process that loaded llama.cpp saw the emulated CPU).
set -euo pipefail
BIN=${1:-dist/kvgraft/kvgraft}
read -r -a RUN <<< "${RUNNER:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KVGRAFT_MODEL_DIR="$work/models" KVGRAFT_HOME="$work/home" QT_QPA_PLATFORM=offscreen
kv() { "${RUN[@]}" "$BIN" "$@"; }
step() { local t0=$SECONDS; "$@"; echo "  $2: $(( SECONDS - t0 )) s" >&2; }

kv --version
step kv doctor --json > "$work/doctor.json"
EXPECT_VARIANT=${EXPECT_VARIANT:-} python3 - "$work/doctor.json" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
assert d["model"]["architecture"] == "gemma3", d
cpu = d["cpu_backend"]
where = cpu["variant"] or "built in"
print(f"doctor ok: {d['model']['name']}, {d['backend']}, llama.cpp CPU backend {where}, fingerprint {d['fingerprint'][:16]}")
print(f"  probe logits: {', '.join(c['logits_sha256'][:12] for c in d['fingerprint_info']['probe']['cases'])}")
want = os.environ.get("EXPECT_VARIANT")
if want:
    assert cpu["variant"] == want, f"llama.cpp chose {where}, expected {want}: the emulated CPU did not run llama.cpp"
PY

cat > "$work/tiny.jsonl" <<'JSONL'
{"id": "t1", "question": "A hut starts with 900 barrels. On day 1 it receives 10 barrels, and each later day it receives 2 more than the day before. Every day it ships out 20 barrels. How many barrels does it hold at the end of day 3?", "solution": "Day 1: 900 + 10 - 20 = 890 barrels.\nDay 2: 890 + 12 - 20 = 882 barrels.\nDay 3: 882 + 14 - 20 = 876 barrels.", "answer": "876"}
JSONL
step kv build "$work/tiny.jsonl" -o "$work/tiny.kvpack" > /dev/null
export KVGRAFT_HOME="$work/home2"
step kv import "$work/tiny.kvpack" --json > /dev/null
step kv ask "A hut starts with 900 barrels. On day 1 it receives 10 barrels, and each later day it receives 2 more than the day before. Every day it ships out 20 barrels. How many barrels does it hold at the end of day 3?" --json > "$work/ask.json"
python3 -c "import json; a=json.load(open('$work/ask.json')); assert a['source']=='graft' and a['exact'] is True and a['proof']=='replayed' and a['answer']=='876'==a['stored_answer'], a; print('ask ok:', a['answer'], '-', a['tokens_decoded'], 'tokens decoded, exact graft, proof', a['proof'])"
echo "bundle smoke test passed"
