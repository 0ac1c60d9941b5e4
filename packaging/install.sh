#!/bin/sh
# Install kvgraft for this user, from the unpacked release folder (no root, nothing downloaded):
#   the app folder      -> ~/.local/lib/kvgraft        (PREFIX=... to choose another prefix)
#   the command         -> ~/.local/bin/kvgraft         (a link to the app's executable)
#   the menu entry      -> ~/.local/share/applications/kvgraft.desktop, and its icon
# ./install.sh --uninstall removes exactly those (the library in the data dir is kept).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
PREFIX=${PREFIX:-$HOME/.local}
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
case "$PREFIX" in /*) ;; *) PREFIX="$PWD/$PREFIX" ;; esac  # absolute: the link and the entry work from anywhere
case "$DATA" in /*) ;; *) DATA="$PWD/$DATA" ;; esac
app="$PREFIX/lib/kvgraft"
link="$PREFIX/bin/kvgraft"
entry="$DATA/applications/kvgraft.desktop"
icon="$DATA/icons/hicolor/scalable/apps/kvgraft.svg"

if [ "${1:-}" = "--uninstall" ]; then
    rm -rf "$app"
    rm -f "$link" "$entry" "$icon"
    if command -v update-desktop-database > /dev/null 2>&1; then
        update-desktop-database -q "$DATA/applications" || true
    fi
    echo "removed kvgraft from $PREFIX (kept: your library in the data dir, and the model in ~/.cache/kvgraft)"
    exit 0
fi
if [ ! -x "$here/kvgraft/kvgraft" ]; then
    echo "install.sh: no kvgraft/kvgraft next to this script: run it from the unpacked release folder" >&2
    exit 1
fi
# The menu entry quotes the path; these characters would need escapes there: refused before anything is written
case "$app" in
    *[\\\"\`\$%]* | *"
"*)
        echo "install.sh: the install path $app holds a character a menu entry cannot quote (\" \` \$ % \\ or a new line): choose another PREFIX" >&2
        exit 1
        ;;
esac
mkdir -p "$PREFIX/lib" "$PREFIX/bin" "$(dirname "$entry")" "$(dirname "$icon")"
rm -rf "$app.new"
cp -R "$here/kvgraft" "$app.new"          # copied whole first, then swapped in: never half an app
rm -rf "$app"
mv "$app.new" "$app"
ln -sfn "$app/kvgraft" "$link"
cp "$here/kvgraft.svg" "$icon"
# substituted with index/substr, not sed or gsub: no character of the path is taken as syntax
EXEC_PATH="$app/kvgraft" awk '{
    i = index($0, "@EXEC@"); if (i) $0 = substr($0, 1, i - 1) "\"" ENVIRON["EXEC_PATH"] "\"" substr($0, i + 6)
    i = index($0, "@ICON@"); if (i) $0 = substr($0, 1, i - 1) "kvgraft" substr($0, i + 6)
    print
}' "$here/kvgraft.desktop.in" > "$entry.tmp"
mv "$entry.tmp" "$entry"
if command -v update-desktop-database > /dev/null 2>&1; then
    update-desktop-database -q "$DATA/applications" || true
fi
echo "installed kvgraft into $app"
echo "  menu entry: $entry"
echo "  command:    $link$(case ":$PATH:" in *":$PREFIX/bin:"*) ;; *) echo " (add $PREFIX/bin to PATH)";; esac)"
echo "First start puts the embedded model into your cache (about 250 MB, a few seconds)."
