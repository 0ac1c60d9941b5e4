#!/usr/bin/env bash
# Smoke test of the bundle: --version, doctor --json, and one `ask` answered from a tiny pack
# (unsigned, so replayed on import: proof `replayed`, its answer stated by the pack, not vouched).
# Runs headless with its own data dir and model cache, so the model comes from the bundle's data.
set -euo pipefail
BIN=${1:-dist/kvgraft/kvgraft}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KVGRAFT_MODEL_DIR="$work/models" KVGRAFT_HOME="$work/home" QT_QPA_PLATFORM=offscreen

"$BIN" --version
"$BIN" doctor --json > "$work/doctor.json"
python3 -c "import json,sys; d=json.load(open('$work/doctor.json')); assert d['model']['architecture']=='gemma3', d; print('doctor ok:', d['model']['name'], d['backend'], d['fingerprint'][:16])"

cat > "$work/tiny.jsonl" <<'JSONL'
{"id": "t1", "question": "A hut starts with 900 barrels. On day 1 it receives 10 barrels, and each later day it receives 2 more than the day before. Every day it ships out 20 barrels. How many barrels does it hold at the end of day 3?", "solution": "Day 1: 900 + 10 - 20 = 890 barrels.\nDay 2: 890 + 12 - 20 = 882 barrels.\nDay 3: 882 + 14 - 20 = 876 barrels.", "answer": "876"}
JSONL
"$BIN" build "$work/tiny.jsonl" -o "$work/tiny.kvpack" > /dev/null
export KVGRAFT_HOME="$work/home2"
"$BIN" import "$work/tiny.kvpack" --json > /dev/null
"$BIN" ask "A hut starts with 900 barrels. On day 1 it receives 10 barrels, and each later day it receives 2 more than the day before. Every day it ships out 20 barrels. How many barrels does it hold at the end of day 3?" --json > "$work/ask.json"
python3 -c "import json; a=json.load(open('$work/ask.json')); assert a['source']=='graft' and a['exact'] is True and a['proof']=='replayed' and a['answer']=='876'==a['stored_answer'], a; print('ask ok:', a['answer'], '-', a['tokens_decoded'], 'tokens decoded, exact graft, proof', a['proof'])"
echo "bundle smoke test passed"
