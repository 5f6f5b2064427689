#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Builds a scaling study's table from its directory: results.csv, results.md
and (with matplotlib) scaling.png. scaling.py calls the same code after its
runs; after --emit-sbatch, run this (or the study's collect.sh) once the
jobs are done. Points whose runs failed or never ran are listed as failed,
points refused when the study was planned as refused, with their message.
Exits 1 when a point has no figures (a refused one only without --allow-missing).

  bench/scaling/collect.py runs/fsdp-weak
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import study as st  # noqa: E402


def main(argv):
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        study, rows, paths = st.write_outputs(os.path.abspath(argv[0]))
    except st.StudyError as e:
        print(f"collect.py: error: {e}", file=sys.stderr)
        return 2
    with open(paths[1]) as f:
        print(f.read())
    code, line = st.outcome(study, rows)
    print("wrote " + ", ".join(paths), file=sys.stderr)
    print(f"collect.py: {line}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
