# SPDX-License-Identifier: BSD-3-Clause
"""What the bench scripts that train a deck several times share: their
arguments (the executable, the deck, steps per run, repetitions, an output
file), the checks of them, and the report's way out."""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parser(doc):
    """An argument parser with the shared arguments; add a script's own, then call parse()."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("ndmini", nargs="?", default=os.path.join(REPO, "build", "miniapp", "ndmini"))
    p.add_argument("--deck", default=os.path.join(REPO, "inputs", "small.toml"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out")
    return p


def parse(p, script):
    """The parsed arguments, or an exit naming `script` and what to fix."""
    a = p.parse_args()
    if a.steps < 2 or a.repeats < 1:
        sys.exit(f"{script}: --steps must be at least 2 (the first is warm-up), --repeats at least 1")
    if not os.access(a.ndmini, os.X_OK):
        sys.exit(f"{script}: {a.ndmini} is not an executable (build first: cmake --build build)")
    return a


def emit(text, out):
    """Prints the report, and writes it to `out` (--out) too when one is given."""
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
