#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The Markdown pages of the repository cite only what is in it.

For README.md, docs/*.md and tests/README.md: every relative
link resolves to a file or folder (and an #anchor to a heading of that page),
no link leaves the repository, and every repository path written in
backticks (`src/...`, `docs/...`, `tests/...`, ...) exists.
Usage: check_links.py SOURCE_DIR
"""
import os
import re
import sys

ROOTS = ("src/", "docs/", "tests/", "bench/", "inputs/", "miniapp/", "cmake/", "spack/", ".ci/")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\s]+)`")


def anchors(path):
    """GitHub's anchors for the headings of a Markdown file."""
    out = set()
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            if in_code or not line.startswith("#"):
                continue
            text = line.lstrip("#").strip().lower()
            text = re.sub(r"[^\w\- ]", "", text)
            out.add(text.replace(" ", "-"))
    return out


def main(source):
    pages = ["README.md", "tests/README.md"]
    pages += ["docs/" + n for n in sorted(os.listdir(os.path.join(source, "docs"))) if n.endswith(".md")]
    problems = []
    checked = 0
    for page in pages:
        path = os.path.join(source, page)
        if not os.path.exists(path):
            problems.append(f"{page}: missing")
            continue
        base = os.path.dirname(path)
        text = open(path, encoding="utf-8").read()
        for target in LINK.findall(text):
            checked += 1
            if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
                continue  # a web page, not a file
            file, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(base, file)) if file else path
            if not os.path.realpath(resolved).startswith(os.path.realpath(source) + os.sep):
                problems.append(f"{page}: link {target} leaves the repository")
            elif not os.path.exists(resolved):
                problems.append(f"{page}: link {target}: no such file")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                problems.append(f"{page}: link {target}: no heading #{anchor} in {os.path.relpath(resolved, source)}")
        for cited in CODE.findall(text):
            if not cited.startswith(ROOTS) or any(c in cited for c in "*<>$%{}"):
                continue
            checked += 1
            if not os.path.exists(os.path.join(source, cited.rstrip("/").split("#")[0])):
                problems.append(f"{page}: cites `{cited}`, which is not in the repository")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(pages)} pages, {checked} links and paths checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
