# shellcheck shell=bash
# SPDX-License-Identifier: BSD-3-Clause
# Sourced by the bench scripts that need a Python module (matplotlib for a
# figure, torch for the PyTorch reference). `python_with MODULE` prints
# $PYTHON when it is set; else the first of python3 and Debian's
# /usr/bin/python3 (a pyenv python3 does not see Debian's packages) that
# imports MODULE; else python3, which the caller's own check then refuses.
python_with() {
  if [ -n "${PYTHON:-}" ]; then
    echo "$PYTHON"
    return
  fi
  local candidate
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import $1" 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo python3
}
