#!/usr/bin/env bash
# Words for a far side's shell.
# revision: 1

# sq WORD: WORD as one POSIX single-quoted word (a far side's login shell may not be bash).
sq() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }

# shell_words WORD...: the words, each quoted, as one line a far side's shell parses back
# into exactly these words.
shell_words() {
  local words=() a
  for a in "$@"; do words+=("$(sq "$a")"); done
  printf '%s' "${words[*]}"
}

# function_call FUNCTION ARGS...: a `bash -c` line that defines this script's functions
# (those FUNCTION calls go with it) and runs FUNCTION with ARGS, for a far side's shell.
function_call() {
  local fn=$1
  shift
  shell_words bash -c "$(declare -f); $fn \"\$@\"" _ "$@"
}
