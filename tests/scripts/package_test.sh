#!/usr/bin/env bash
# The Debian package: made by CPack from a build tree, installed with dpkg, used from outside
# the source tree, then purged, leaving none of its files behind. Needs root (CI runs as root).
# Usage: tests/scripts/package_test.sh BUILD_DIR   (configured with -DCMAKE_INSTALL_PREFIX=/usr)
set -euo pipefail
build=$(cd "$1" && pwd)
[ "$(id -u)" = 0 ] || { echo "package test: needs root (dpkg -i)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"; dpkg -s liboffload > /dev/null 2>&1 && dpkg --purge liboffload > /dev/null' EXIT
(cd "$work" && cpack -G DEB --config "$build/CPackConfig.cmake" > cpack.log) || { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/liboffload_*.deb)
dpkg -i "$deb" > /dev/null
files=$(dpkg -L liboffload)
for f in '/usr/lib/(x86_64-linux-gnu/)?liboffload.so' /usr/bin/offloadd /usr/bin/offloadctl /usr/bin/offload-run \
         /usr/include/offload/offload.h '/usr/lib/(x86_64-linux-gnu/)?pkgconfig/liboffload.pc' \
         /usr/lib/systemd/user/offloadd.service /usr/lib/python3/dist-packages/liboffload/__init__.py \
         /usr/lib/python3/dist-packages/liboffload/integrations/{hf,lightning}.py; do
  grep -Eqx "$f" <<< "$files" || { echo "package test: $f is not in the package" >&2; exit 1; }
done
so=$(grep -E '/liboffload\.so$' <<< "$files")
cd /
# Debian's python3, whose path holds /usr/lib/python3/dist-packages (a pyenv or venv python does not).
py=/usr/bin/python3
version=$(offloadctl --version)
[[ "$version" == "offloadctl "* ]] || { echo "package test: offloadctl --version said '$version'" >&2; exit 1; }
offloadd --version > /dev/null
offload-run --help > /dev/null
[ "$(offload-run --print-env | head -1)" = "LD_PRELOAD=$so" ] ||
  { echo "package test: offload-run does not preload the installed library" >&2; exit 1; }
pyver=$("$py" -c "import liboffload; print(liboffload.__version__)")
[[ "$version" == "offloadctl $pyver "* ]] || { echo "package test: python says $pyver, offloadctl '$version'" >&2; exit 1; }
[ "$(pkg-config --modversion liboffload)" = "$pyver" ] || { echo "package test: pkg-config disagrees" >&2; exit 1; }
loaded=$(offload-run -- "$py" -c "import liboffload; print(liboffload.loaded(), liboffload.version())")
[[ "$loaded" == "True $pyver "* ]] || { echo "package test: under offload-run python saw '$loaded'" >&2; exit 1; }
if command -v systemd-analyze > /dev/null; then
  systemd-analyze verify /usr/lib/systemd/user/offloadd.service ||
    { echo "package test: systemd-analyze verify refused the unit" >&2; exit 1; }
fi
dpkg --purge liboffload > /dev/null
left=""
while read -r f; do
  [ -f "$f" ] && left+=" $f"
done <<< "$files"
[ -z "$left" ] || { echo "package test: left after purge:$left" >&2; exit 1; }
echo "package: built, installed, used from /, purged clean ($(basename "$deb"))"
