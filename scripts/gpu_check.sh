#!/usr/bin/env bash
# The GPU kit's device script: build llama-cpp-python 0.3.36 for CUDA from the stripped source in
# .gpukit/, write the synthetic models, run scripts/gpu_exactness.py with every layer offloaded.
#
#   on the GPU machine, from the repository root:    bash scripts/gpu_check.sh
#   here, as a rehearsal (a CPU build, same steps):  GPU_KIT_CPU=1 bash scripts/gpu_check.sh
#
# Make the kit first, here: .venv/bin/python scripts/gpu_kit.py (docs: README, "CUDA").
# Environment: WORK (scratch, default /tmp/kvgraft-gpu), OUT (where the receipts and the log go,
# default $WORK/out), PYTHON (default python3; it needs numpy), JOBS (build jobs, default nproc),
# GPU_KIT_STEP=build|check|all (default all: a build too long for one call can run as two), and
# QUICK=1 (two prefixes and two schedules instead of four and five; the CPU rehearsal's default).
# The build folder is kept in $WORK/build, so a second call resumes a build that was cut off.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
KIT=${KIT:-$REPO/.gpukit}
WORK=${WORK:-/tmp/kvgraft-gpu}
OUT=${OUT:-$WORK/out}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
STEP=${GPU_KIT_STEP:-all}
VERSION=0.3.36

if [ "${GPU_KIT_CPU:-0}" = 1 ]; then
    MODE="CPU rehearsal"
    export CMAKE_ARGS="-DGGML_CUDA=off -DLLAVA_BUILD=off"
    QUICK=${QUICK:-1}
else
    MODE="CUDA"
    export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=off"
    QUICK=${QUICK:-0}
fi
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS

say() { printf '[gpu_check %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { say "error: $*" >&2; exit 2; }

SDIST=$KIT/llama-cpp-python-$VERSION-stripped.tar.gz
[ -f "$SDIST" ] || die "$SDIST is missing: run .venv/bin/python scripts/gpu_kit.py here first"
"$PYTHON" -c 'import numpy' 2>/dev/null || die "$PYTHON has no numpy"
mkdir -p "$WORK" "$OUT"
say "$MODE; python $("$PYTHON" -c 'import platform; print(platform.python_version())'); $JOBS jobs; work in $WORK"

# Pure-Python wheels the check needs (gguf, diskcache), and the build backend where it is missing.
SITE=$WORK/site
if [ ! -d "$SITE" ]; then
    wheels=("$KIT"/wheels/*.whl)
    "$PYTHON" -c 'import scikit_build_core' 2>/dev/null || wheels+=("$KIT"/wheels-build/*.whl)
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}"
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}

# 1. The build: llama_cpp into $WORK/llama (kept between calls; removed to build again).
if [ "$STEP" != check ]; then
    if [ -f "$WORK/llama/llama_cpp/__init__.py" ]; then
        say "build: $WORK/llama already holds llama_cpp (remove it to build again)"
    else
        rm -rf "$WORK/src-llama" && mkdir -p "$WORK/src-llama"
        tar -xzf "$SDIST" -C "$WORK/src-llama" --strip-components=1
        say "build: CMAKE_ARGS=$CMAKE_ARGS"
        t0=$(date +%s)
        "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir \
            --target "$WORK/llama.partial" -C "build-dir=$WORK/build" "$WORK/src-llama" 2>&1 | tee "$OUT/build.log"
        rm -rf "$WORK/llama" && mv "$WORK/llama.partial" "$WORK/llama"
        echo $(( $(date +%s) - t0 )) >"$WORK/build_seconds"
        say "build: $(cat "$WORK/build_seconds") s"
    fi
fi
[ "$STEP" = build ] && exit 0
[ -f "$WORK/llama/llama_cpp/__init__.py" ] || die "no build in $WORK/llama: run with GPU_KIT_STEP=build first"

# 2. kvgraft's engine as a plain source tree (the check imports kvgraft.engine only) and the models.
rm -rf "$WORK/src" && mkdir -p "$WORK/src/kvgraft"
cp "$REPO/packaging/kvgraft/__init__.py" "$WORK/src/kvgraft/"
cp -r "$REPO/engine" "$WORK/src/kvgraft/engine"
cp "$REPO/scripts/synthetic_gguf.py" "$REPO/scripts/gpu_exactness.py" "$WORK/src/"
export PYTHONPATH=$WORK/src:$WORK/llama:$PYTHONPATH
mkdir -p "$WORK/models"
"$PYTHON" "$WORK/src/synthetic_gguf.py" --arch gemma3 -o "$WORK/models/gemma3.gguf" --seed 0
"$PYTHON" "$WORK/src/synthetic_gguf.py" --arch llama -o "$WORK/models/llama.gguf" --seed 0

# 3. The exactness suite: one receipts JSON.
KIT_BUILD_S=$(cat "$WORK/build_seconds" 2>/dev/null || true)
export KIT_BUILD_S
flags=()
[ "$QUICK" = 1 ] && flags+=(--quick)
t0=$(date +%s)
rc=0
"$PYTHON" -u "$WORK/src/gpu_exactness.py" --models "$WORK/models" --out "$OUT/receipts.json" "${flags[@]}" \
    2>&1 | tee "$OUT/check.log" || rc=$?
say "build time: ${KIT_BUILD_S:-?} s; check time: $(( $(date +%s) - t0 )) s; receipts: $OUT/receipts.json"
exit $rc
