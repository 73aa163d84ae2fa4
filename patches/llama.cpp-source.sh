#!/bin/sh
# The llama-cpp-python sdist at version $2, unpacked into directory $3 and its vendored
# llama.cpp patched, with pip $1: what `make setup` builds the wheel from, and `make
# bench-peer` llama-server.
set -eu
pip=$1 version=$2 dest=$3
here=$(cd "$(dirname "$0")" && pwd)
"$pip" download -q --no-binary :all: --no-deps -d "$dest" "llama-cpp-python==$version"
tar xzf "$dest/llama_cpp_python-$version.tar.gz" -C "$dest"
git -C "$dest/llama_cpp_python-$version/vendor/llama.cpp" apply \
    "$here/llama.cpp-scattered-positions.patch"
