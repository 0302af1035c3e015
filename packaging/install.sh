#!/bin/sh
# Install this Ember bundle for the current user: the program stays in this folder; a link in
# ~/.local/bin, the menu entry, AppStream metadata and icons go under ~/.local/share (or the
# PREFIX given: `PREFIX=/usr/local sudo ./install.sh`). Run it again after moving the folder.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=${PREFIX:-$HOME/.local}
mkdir -p "$PREFIX/bin"
ln -sf "$HERE/ember" "$PREFIX/bin/ember"
cp -R "$HERE/share/." "$PREFIX/share/"
command -v update-desktop-database >/dev/null && update-desktop-database "$PREFIX/share/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$PREFIX/share/icons/hicolor" || true
echo "Ember installed: $PREFIX/bin/ember (menu entry io.github.ember.Ember)"
