#!/usr/bin/env bash
# The distributable artifact: dist/kvgraft-VERSION-linux-x86_64.tar.gz holding the one-folder app,
# its menu entry template, the icon and install.sh. From the repository root:
#   packaging/make_release.sh DIST VERSION        (make bundle: packaging/make_release.sh dist 0.1.0)
set -euo pipefail
DIST=${1:?usage: packaging/make_release.sh DIST VERSION}
VERSION=${2:?usage: packaging/make_release.sh DIST VERSION}
name="kvgraft-$VERSION-linux-x86_64"
stage="$DIST/$name"
rm -rf "$stage"
trap 'rm -rf "$stage" "$DIST/$name.tar.gz.tmp"' EXIT  # a failed run leaves no half-made artifact
mkdir -p "$stage"
cp -R "$DIST/kvgraft" "$stage/kvgraft"
cp packaging/install.sh packaging/kvgraft.desktop.in "$stage/"
cp packaging/kvgraft/kvgraft.svg "$stage/kvgraft.svg"
cat > "$stage/README.txt" <<TXT
kvgraft $VERSION for Linux x86-64: any x86-64 CPU (llama.cpp picks its CPU kernels at start),
glibc $(ldd --version 2>/dev/null | head -1 | grep -o '[0-9]*\.[0-9]*$' || echo "of the build machine") or newer.

  ./install.sh               the app in ~/.local/lib/kvgraft, \`kvgraft\` in ~/.local/bin, a menu entry
  ./install.sh --uninstall   removes them again
  ./kvgraft/kvgraft          runs it in place without installing (no arguments: the window)

The window needs the X11 libraries Qt uses (\`kvgraft doctor\` names any that are missing).
TXT
tar -C "$DIST" -czf "$DIST/$name.tar.gz.tmp" "$name"
mv "$DIST/$name.tar.gz.tmp" "$DIST/$name.tar.gz"
rm -rf "$stage"
mb() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1e6 }'; }
echo "artifact: $DIST/$name.tar.gz ($(mb "$(stat -c %s "$DIST/$name.tar.gz")") MB packed, $(mb "$(du -sb "$DIST/kvgraft" | cut -f1)") MB unpacked)"
