#!/usr/bin/env bash
# AMD compile routes on a fresh Debian 12 machine without a GPU (run as root; idempotent):
#   1. hipRTC from Debian's ROCm 5.2 (gfx90a through hip-python, the runtime path);
#   2. the offline clang-22 toolchain in the user's cache (gfx90a, gfx942, gfx950).
# hip-python looks for unversioned libhiprtc.so / libamdhip64.so; rocjit resolves Debian's
# versioned libamdhip64.so.5 itself (hipRTC lives inside it in ROCm 5.x), so no symlinks or
# LD_LIBRARY_PATH are needed.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
ROCM_PACKAGES=(libamdhip64-5 libamdhip64-dev libamd-comgr2 rocm-device-libs libhiprtc-builtins5)
# clang compiles HIP with the host C++ headers (libstdc++) even for device-only builds.
HOST_PACKAGES=(libstdc++-12-dev libc6-dev ca-certificates debian-archive-keyring)

missing=()
for pkg in "${ROCM_PACKAGES[@]}" "${HOST_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "ROCm 5.2 hipRTC packages already installed"
fi

"$PYTHON" -m pip install -q "hip-python>=6.0" "msgpack>=1.0"

# Run from the repository root so `-m rocjit` works without an installed package.
cd "$(dirname "$0")/.."
"$PYTHON" -m rocjit toolchain install
"$PYTHON" -m rocjit toolchain status
