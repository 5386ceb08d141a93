#!/usr/bin/env bash
# A node's own NCCL library, as the preflight reads it.
# revision: 1

# nccl_build FILE: the build compiled into the library FILE ("2.27.3+cuda12.9"), or
# nothing when it holds none.
nccl_build() {
  grep -aoE -m1 'NCCL version [0-9]+[.][0-9]+[.][0-9]+[+]cuda[0-9]+[.][0-9]+' "$1" | head -n 1 | cut -d' ' -f3 || true
}

# nccl_host GLOB...: prints nccl_host=, the newest libnccl.so.X.Y.Z among the GLOBs as its
# build, else its file name's release; empty without one.
nccl_host() {
  local lib b=
  # shellcheck disable=SC2068,SC2010  # the globs expand here; library names are plain
  lib=$(ls $@ 2>/dev/null | grep -E '[.]so[.][0-9]+[.][0-9]+[.][0-9]+$' | sort -V | tail -n 1 || true)
  [ -z "$lib" ] || b=$(nccl_build "$lib")
  echo "nccl_host=${b:-${lib##*.so.}}"
}

# nccl_library PATH: prints nccl_lib= (the file PATH resolves to, empty when there is
# none) and nccl_lib_version= (its build, else its file name's release).
nccl_library() {
  local r b
  r=$(readlink -f "$1" 2>/dev/null || true)
  if [ -n "$r" ] && [ -f "$r" ] && [ -r "$r" ]; then
    echo "nccl_lib=$r"
    b=$(nccl_build "$r")
    echo "nccl_lib_version=${b:-${r##*.so.}}"
  else
    echo nccl_lib=
    echo nccl_lib_version=
  fi
}
