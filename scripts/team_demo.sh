#!/usr/bin/env bash
# The README's team-library run: a throwaway SeaweedFS on loopback; Alice deposits solutions and
# pushes them signed; Bob, with an empty data dir, trusts her key, pulls, verifies, asks.
#   bash scripts/team_demo.sh [N_PROBLEMS]
set -euo pipefail
cd "$(dirname "$0")/.."
KV=$PWD/.venv/bin/kvgraft
PY=$PWD/.venv/bin/python
n=${1:-6}
work=$(mktemp -d)
$PY -m kvgraft.app.lab.local_s3 --bucket team > "$work/s3.log" 2>&1 &
s3=$!
trap 'kill $s3 2>/dev/null; wait $s3 2>/dev/null; rm -rf "$work"' EXIT
until grep -q "S3 endpoint" "$work/s3.log"; do sleep 0.5; kill -0 $s3; done
endpoint=$(sed -n 's/.*S3 endpoint: //p' "$work/s3.log")
export AWS_ACCESS_KEY_ID=kvgraft-test AWS_SECRET_ACCESS_KEY=kvgraft-test-secret AWS_EC2_METADATA_DISABLED=true
$PY -c "
from kvgraft.app.lab.starter_problems import starter_problems
from kvgraft.app.proof.problems import write_jsonl
write_jsonl(starter_problems($n), '$work/problems.jsonl')"
question=$($PY -c "import json; print(json.loads(open('$work/problems.jsonl').readline())['question'])")
run() { echo "\$ kvgraft $*"; "$KV" "$@" 2>&1 | grep -v -E '^(build|push|pull|verify): ' ; }
cd "$work"
A=(--home alice); B=(--home bob)
run "${A[@]}" build problems.jsonl -o problems.kvpack > /dev/null
"$KV" "${A[@]}" keys generate alice > /dev/null
echo "# Alice: $n solutions deposited; SeaweedFS $endpoint"
run "${A[@]}" remote add team s3://team/lib --endpoint-url "$endpoint"
run "${A[@]}" push team --all --sign alice
run "${A[@]}" verify --remote team
pub=$("$KV" "${A[@]}" keys list --json | $PY -c "import json,sys; print(json.load(sys.stdin)['own']['alice']['public_key'])")
"$KV" "${B[@]}" keys trust "$pub" --name alice > /dev/null
"$KV" "${B[@]}" remote add team s3://team/lib --endpoint-url "$endpoint" > /dev/null
echo "# Bob: an empty data dir that trusts Alice's key and names the same remote"
run "${B[@]}" pull team
run "${B[@]}" verify --library --replay
run "${B[@]}" ask "$question"
