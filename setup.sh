#!/usr/bin/env bash
# One-time setup on a fresh Debian machine (run as root): system packages and the venv.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")"

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v ssh >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || need_apt+=(openssh-client)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# The venv is made from the python3 on PATH: 3.11 to 3.14, the Pythons the pinned Ray and
# Pulumi publish wheels for (pyproject.toml requires-python).
if [ ! -x .venv/bin/python ]; then
  if ! python3 -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 14))'; then
    echo "setup: python3 is $(python3 -V 2>&1); the venv needs Python 3.11 to 3.14" \
      "(put one first on PATH)" >&2
    exit 1
  fi
  python3 -m venv .venv
fi
.venv/bin/pip install -q -r requirements.txt
# The project itself, editable: `components` and `sparkvllm` import from any folder (a
# Pulumi project of the user's, and Pulumi's provider host, which runs in the program's
# folder and sees only it and the virtualenv). A user's own venv: `pip install PATH`.
.venv/bin/pip install -q --no-deps -e .
echo "setup: done (.venv ready; Docker engine installed, started on demand by 'python -m sim up')"
