#!/usr/bin/env bash
# Run the one-folder bundle's executable under qemu-x86_64 emulating an older CPU, in ONE process.
#
#   packaging/run_emulated.sh CPU dist/kvgraft/kvgraft ARGS...      (CPU: a `qemu-x86_64 -cpu help` model)
#   QEMU_STRACE=1 packaging/run_emulated.sh ...                      (qemu's -strace: every system call)
#
# The trap: PyInstaller's bootloader on Linux sets LD_LIBRARY_PATH and then re-executes itself
# (execvp without fork), and qemu-user runs that new image natively: the emulated CPU would only ever
# run the bootloader, never llama.cpp. The bootloader skips the restart when it finds the environment
# of its own restarted process: _PYI_ARCHIVE_FILE naming this executable, _PYI_PARENT_PROCESS_LEVEL=0,
# and the library path it would have set (the bundle's _internal folder). We set exactly that, so the
# emulated process is the one that loads llama.cpp and decodes. `kvgraft doctor` then names the CPU
# variant llama.cpp chose from the emulated CPUID (packaging/bundle_check.sh checks it).
set -euo pipefail
cpu=$1
bin=$(realpath "$2")
shift 2
export _PYI_ARCHIVE_FILE="$bin" _PYI_PARENT_PROCESS_LEVEL=0
export LD_LIBRARY_PATH="$(dirname "$bin")/_internal${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# qemu warns about host-only CPUID bits it cannot emulate (tsc-deadline, x2apic): noise, filtered
strace=()
[ -n "${QEMU_STRACE:-}" ] && strace=(-strace)
exec qemu-x86_64 -cpu "$cpu" "${strace[@]}" "$bin" "$@" 2> >(grep --line-buffered -v "TCG doesn't support requested feature" >&2)
