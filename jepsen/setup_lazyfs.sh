#!/bin/bash
# Build LazyFS (https://github.com/dsrhaslab/lazyfs) from its source for the harness's
# power-loss nemesis (docs/jepsen.md). `make lazyfs` runs this. Idempotent: does nothing when
# the pinned revision is already built.
#
#   LAZYFS_PREFIX  where to build (default: <repo>/.cache/lazyfs; outside the source tree's
#                  tracked files); the binary ends up in $LAZYFS_PREFIX/src/lazyfs/build/lazyfs
#   LAZYFS_REPO    where to clone from (default: the GitHub repository; a local clone or
#                  mirror works too, e.g. where github.com is not reachable)
#   LAZYFS_REV     the commit to build (default: pinned below)
#
# Only where /dev/fuse is usable (it exits 0 with a message otherwise: nothing to build for).
# Not part of CI: it clones from GitHub, and CI machines may reach package registries only.
#
# Dependencies come from Debian (apt, as root): g++, cmake, libfuse3-dev, fuse3, and the two
# libraries LazyFS's CMake would otherwise download from GitHub at build time, at the very
# versions it pins (toml11 3.7.1, spdlog 1.10.0): libtoml11-dev, libspdlog-dev (+ libfmt-dev).
# Small stand-in CMake projects point LazyFS's FetchContent at those packages, so the build
# needs no network beyond the clone.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${LAZYFS_PREFIX:-$here/.cache/lazyfs}
REPO=${LAZYFS_REPO:-https://github.com/dsrhaslab/lazyfs}
REV=${LAZYFS_REV:-a47a5baea559020f29902662de77764b0cbd62ce}
SRC=$PREFIX/src
BIN=$SRC/lazyfs/build/lazyfs
STAMP=$PREFIX/built-rev

if ! { exec 3<>/dev/fuse; } 2>/dev/null; then
    echo "setup_lazyfs: /dev/fuse is not usable here; the power-loss nemesis cannot run" >&2
    exit 0
fi
exec 3>&-

if [ -x "$BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$REV" ]; then
    echo "setup_lazyfs: LazyFS $REV is built: $BIN"
    exit 0
fi

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
packages="g++ cmake make git pkg-config libfuse3-dev fuse3 libtoml11-dev libspdlog-dev libfmt-dev"
missing=""
for p in $packages; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup_lazyfs: installing$missing (apt)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

mkdir -p "$PREFIX"
if [ ! -d "$SRC/.git" ]; then
    rm -rf "$SRC"
    # Only what the build needs (lazyfs/, libs/): the test data and reproduced-bug scripts
    # are large, and some mirrors omit the largest files.
    git clone -q --no-checkout "$REPO" "$SRC"
    git -C "$SRC" sparse-checkout set lazyfs libs
fi
if ! git -C "$SRC" cat-file -e "$REV^{commit}" 2>/dev/null; then
    git -C "$SRC" fetch -q origin
fi
git -C "$SRC" checkout -q --force "$REV"
git -C "$SRC" clean -q -fdx

# Stand-ins for LazyFS's FetchContent dependencies: Debian's packages of the same versions.
shim=$PREFIX/shim
mkdir -p "$shim/toml11" "$shim/spdlog"
cat >"$shim/toml11/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.10)
project(toml11_debian CXX)
find_package(toml11 3.7 REQUIRED)
set_target_properties(toml11::toml11 PROPERTIES IMPORTED_GLOBAL TRUE)
EOF
cat >"$shim/spdlog/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.10)
project(spdlog_debian CXX)
find_package(spdlog 1.10 REQUIRED)
set_target_properties(spdlog::spdlog PROPERTIES IMPORTED_GLOBAL TRUE)
if(TARGET fmt::fmt)
  set_target_properties(fmt::fmt PROPERTIES IMPORTED_GLOBAL TRUE)
endif()
add_library(spdlog INTERFACE)
target_link_libraries(spdlog INTERFACE spdlog::spdlog)
EOF

jobs=${LAZYFS_JOBS:-1}
cmake -S "$SRC/libs/libpcache" -B "$SRC/libs/libpcache/build" -DCMAKE_BUILD_TYPE=Release \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_TOML="$shim/toml11" \
    -DFETCHCONTENT_SOURCE_DIR_SPDLOG="$shim/spdlog" >/dev/null
cmake --build "$SRC/libs/libpcache/build" -j "$jobs"
# lazyfs's own CMakeLists links libpcache.so and expects spdlog inside libpcache's build; with
# Debian's shared spdlog (compiled, external fmt) it links spdlog and fmt itself.
cmake -S "$SRC/lazyfs" -B "$SRC/lazyfs/build" -DCMAKE_BUILD_TYPE=Release -DLAZYFS_BUILD_TESTS=OFF \
    -DCMAKE_CXX_FLAGS="-DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL" \
    -DCMAKE_CXX_STANDARD_LIBRARIES="-lspdlog -lfmt" \
    -DCMAKE_BUILD_RPATH="$SRC/libs/libpcache/build" >/dev/null
cmake --build "$SRC/lazyfs/build" -j "$jobs"

test -x "$BIN"
echo "$REV" >"$STAMP"
echo "setup_lazyfs: built $BIN"
