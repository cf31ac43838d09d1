#!/usr/bin/env bash
# Installs what liboffload builds and tests with (Debian 12 / Ubuntu 24.04). Idempotent.
# The CUDA toolkit is expected in /usr/local/cuda (or $CUDA_HOME): headers, CUPTI headers
# and the libcuda stub. Nothing links libcuda: the shim reaches the driver at run time.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config python3
      libboost-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
      clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/cuda.h" ]; then
  echo "install-deps: CUDA toolkit headers not found in $cuda (set CUDA_HOME)" >&2
  exit 1
fi
echo "install-deps: ok (CUDA headers in $cuda)"
