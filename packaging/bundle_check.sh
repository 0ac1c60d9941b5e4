#!/usr/bin/env bash
# `make bundle-check`: the bundle's smoke test natively and on an emulated older CPU, with a control.
#
#   packaging/bundle_check.sh [BIN] [CPU]     (defaults: dist/kvgraft/kvgraft, Nehalem)
#
# 1. natively (the build machine's CPU);
# 2. under qemu-x86_64 -cpu CPU, in one emulated process (packaging/run_emulated.sh): doctor must name
#    the CPU variant llama.cpp chose for that CPU (Nehalem: SSE4.2, no AVX: llama.cpp's sse42 variant,
#    older than any build machine here), then a pack is built, imported (replayed) and asked, all
#    emulated (about 10 minutes: TCG runs this code about 300x slower; SandyBridge's AVX runs 4x slower
#    still, measured, so it is not the default);
# 3. the control: the developer's .venv, whose llama.cpp was built with -march=native, run under the
#    same emulated CPU must die on an illegal instruction (exit 132), so the emulation bites.
# Also shown: the bootloader's restart (an execve qemu cannot follow) with and without run_emulated.sh.
set -euo pipefail
BIN=${1:-dist/kvgraft/kvgraft}
CPU=${2:-Nehalem}
case "$CPU" in  # the variant llama.cpp must choose on that CPU (ggml/src/CMakeLists.txt: its x86 variants)
    Nehalem* | Westmere*) VARIANT=sse42 ;;
    SandyBridge*) VARIANT=sandybridge ;;
    IvyBridge*) VARIANT=ivybridge ;;
    Haswell* | Broadwell*) VARIANT=haswell ;;
    *) VARIANT=${VARIANT:?name the llama.cpp variant expected on $CPU: VARIANT=...} ;;
esac
NATIVE_PY=${NATIVE_PY:-.venv/bin/python}
here=$(cd "$(dirname "$0")" && pwd)
command -v qemu-x86_64 > /dev/null || { echo "bundle-check: qemu-x86_64 not found (sudo apt-get install qemu-user)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "bundle-check: $BIN not found: run make bundle first" >&2; exit 2; }
filter() { grep -v "TCG doesn't support requested feature" || true; }

echo "== 1. natively on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
t0=$SECONDS
"$here/smoke_test.sh" "$BIN"
native_s=$(( SECONDS - t0 ))

echo "== 2. emulated: qemu-x86_64 -cpu $CPU (expect llama.cpp's $VARIANT variant)"
n_plain=$(qemu-x86_64 -cpu "$CPU" -strace "$BIN" --version 2>&1 | grep -c 'execve(' || true)
n_ours=$(QEMU_STRACE=1 "$here/run_emulated.sh" "$CPU" "$BIN" --version 2>&1 | grep -c 'execve(' || true)
echo "bootloader restarts seen by qemu: $n_plain when started plainly (the rest would run natively), $n_ours through run_emulated.sh"
[ "$n_ours" = 0 ] || { echo "bundle-check: the bootloader still re-executes itself under qemu" >&2; exit 1; }
t0=$SECONDS
RUNNER="$here/run_emulated.sh $CPU" EXPECT_VARIANT="$VARIANT" "$here/smoke_test.sh" "$BIN"
emulated_s=$(( SECONDS - t0 ))
echo "smoke test: ${native_s} s natively, ${emulated_s} s emulated"

echo "== 3. control: the -march=native build ($NATIVE_PY) under qemu-x86_64 -cpu $CPU"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
set +e
KVGRAFT_HOME="$work/home" QT_QPA_PLATFORM=offscreen qemu-x86_64 -cpu "$CPU" "$NATIVE_PY" -m kvgraft doctor > "$work/out" 2>&1
rc=$?
set -e
filter < "$work/out" | tail -2
if [ "$rc" = 132 ] || grep -q "Illegal instruction" "$work/out"; then
    echo "control: the native build died on an illegal instruction (exit $rc), as it must"
else
    echo "bundle-check: the native build did not die under the emulated CPU (exit $rc): the emulation does not bite" >&2
    exit 1
fi
echo "bundle check passed: natively, on an emulated $CPU (llama.cpp variant $VARIANT), and the control died"
