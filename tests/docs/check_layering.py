#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The includes of src/ and miniapp/ follow the table of docs/architecture.md.

The table under "The folders and their arrows" names each folder and, in its
last column, the folders it may include. Every `#include "x/..."` in
src/**/*.{hpp,cpp} and miniapp/ whose x is another folder of the table must be
in that column. A folder may include itself, and a subfolder (src/comm/mpi/)
belongs to its parent. Every folder of src/ must have a row, every row a
folder, and each row may name only folders further down the table, so the
arrows run one way.
Usage: check_layering.py SOURCE_DIR
"""
import os
import re
import sys

HEADING = "## The folders and their arrows"
ROW = re.compile(r"^\|\s*`(?:src/)?([\w-]+)/`\s*\|.*\|([^|]*)\|\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"(([\w-]+)/[^"]*)"')
SUFFIXES = (".hpp", ".cpp", ".h", ".cc", ".cu", ".hpp.in")


def read_table(path):
    """The rows of the table, in order: [(folder, set of allowed folders)]."""
    rows = []
    in_section = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                in_section = line.strip() == HEADING
                continue
            if not in_section:
                continue
            m = ROW.match(line.rstrip("\n"))
            if not m:
                continue
            cell = m.group(2).strip()
            allowed = set() if cell == "nothing" else {w.strip() for w in cell.split(",") if w.strip()}
            rows.append((m.group(1), allowed))
    return rows


def sources(root):
    for base, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(SUFFIXES):
                yield os.path.join(base, name)


def main(source):
    table_path = os.path.join(source, "docs", "architecture.md")
    rows = read_table(table_path)
    problems = []
    if not rows:
        print(f"check_layering: no table under '{HEADING}' in {table_path}")
        return 1
    order = [folder for folder, _ in rows]
    allowed = dict(rows)

    # The table itself: every arrow points further down, to a folder it has.
    for i, (folder, deps) in enumerate(rows):
        for dep in sorted(deps):
            if dep not in allowed:
                problems.append(f"docs/architecture.md: row {folder}/ names {dep}, which has no row")
            elif order.index(dep) <= i:
                problems.append(f"docs/architecture.md: row {folder}/ names {dep}, which is not further down")

    src = os.path.join(source, "src")
    for name in sorted(os.listdir(src)):
        if os.path.isdir(os.path.join(src, name)) and name not in allowed:
            problems.append(f"docs/architecture.md: src/{name}/ has no row in the table")
    for folder in order:
        if folder != "miniapp" and not os.path.isdir(os.path.join(src, folder)):
            problems.append(f"docs/architecture.md: row {folder}/ names no folder of src/")

    checked = 0
    for top in ("src", "miniapp"):
        for path in sources(os.path.join(source, top)):
            rel = os.path.relpath(path, source).replace(os.sep, "/")
            parts = rel.split("/")
            owner = parts[1] if top == "src" else "miniapp"
            if top == "src" and len(parts) < 3:
                continue  # a file directly in src/ belongs to no folder
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(2)
                    if target == owner or not os.path.isdir(os.path.join(src, target)):
                        continue  # itself, or not one of ours (a system or generated header)
                    checked += 1
                    if owner not in allowed:
                        continue  # reported above as a missing row
                    if target not in allowed[owner]:
                        problems.append(f"{rel}:{lineno}: {owner}/ includes \"{m.group(1)}\""
                                        f" but the table lets {owner}/ include only: "
                                        f"{', '.join(sorted(allowed[owner])) or 'nothing'}")
    for p in problems:
        print(p)
    print(f"check_layering: {len(rows)} folders, {checked} includes between folders, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
