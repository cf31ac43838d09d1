#!/usr/bin/env bash
# Builds liboffload.so, offloadd and offloadctl here (Release), strips them into .carry/bin and
# records the commit they were built from in .carry/commit ("+dirty" when the tree has
# uncommitted changes), for scripts/gpu/run.sh on the GPU machine (carry [".carry"]).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build-release}  # not build/: a test build may be running there
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DOFFLOAD_TESTS=OFF > /dev/null
cmake --build "$build" -j"$(nproc)" --target offload offloadd offloadctl
mkdir -p "$root/.carry/bin"
for f in liboffload.so offloadd offloadctl; do strip -o "$root/.carry/bin/$f" "$build/$f"; done
commit=$(git -C "$root" rev-parse HEAD)
[ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ] || commit="$commit+dirty"
echo "$commit" > "$root/.carry/commit"
# DEB=1: the Debian package too (.carry/liboffload.deb), for scripts/gpu/installed_check.sh.
if [ "${DEB:-0}" = 1 ]; then
  cmake -S "$root" -B "$build" -DCMAKE_INSTALL_PREFIX=/usr > /dev/null
  cmake --build "$build" -j"$(nproc)"
  (cd "$build" && cpack -G DEB > cpack.log) || { cat "$build/cpack.log"; exit 1; }
  cp "$(ls -t "$build"/liboffload_*.deb | head -1)" "$root/.carry/liboffload.deb"
fi
echo "prepared .carry/bin at $commit"
