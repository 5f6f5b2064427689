# SPDX-License-Identifier: BSD-3-Clause
"""Every fenced shell command of README.md and docs/*.md, against the binary.

Usage: check_commands.py SOURCE_DIR NDMINI MPIEXEC [PAGE ...]

Each command of a ```sh / ```bash block (backslash continuations and
`&&` chains split into their commands, comments dropped) is, by what it
needs:
- run: an `ndmini` command of at most 2 ranks that needs no cluster
  (`train` of inputs/tiny.toml with `--set train.steps=2` appended, the one
  substitution, so it takes seconds; `check` and `plan` as written), in a
  scratch folder, under a time bound; it must exit 0;
- checked: an `ndmini train` of more ranks, of a larger deck, or launched by
  srun (a cluster), is given to `ndmini check` with its deck, its `--set`s and
  `--world N` (N from mpiexec -n, or srun's -n / -N x --ntasks-per-node):
  the layout, the deck and the memory estimate must be accepted;
- parsed: a synopsis (DECK.toml, N, [--top K], ...), a line of shell around
  ndmini (`$VAR`, `$(...)`), `plan --calibrate` (a minute; the plan_calibrate
  test runs it) or a command whose files are a user's (deck.toml, PATH): every
  `--option` must be one that `ndmini SUBCOMMAND --help` lists;
- needs a build, root or a cluster (cmake, ctest, spack, sbatch, nsys, the
  dependency installer): not run; a preset must be one of CMakePresets.json,
  a ctest label one the suite has, a script one that exists, and the program
  one of KNOWN_PROGRAMS (a typo is not a new tool).
Distinct commands are handled once. Exit status 1, listing each failure
with its page, when a command fails.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

RUN_TIMEOUT_S = 60
KNOWN_PROGRAMS = {"cmake", "ctest", "spack", "sbatch", "scontrol", "export", "if", "fi", "exit", "[", "nsys",
                  ".ci/install-deps.sh", "env", "git"}
LAUNCHERS = {"mpiexec", "mpirun", "srun"}
SMALL_DECKS = {"inputs/tiny.toml"}  # seconds for 2 steps; small.toml takes tens under load: checked
PLACEHOLDER = re.compile(r"^(\[.*|.*\]|[A-Z][A-Z_]*(\.[a-z]+)?|\.\.\.|\||N|K|P|PATH|STEP)$")


def fenced_commands(text):
    """(line number, command) of each shell command of the ```sh/bash blocks."""
    out = []
    for m in re.finditer(r"^```(sh|bash|shell)\n(.*?)^```", text, re.M | re.S):
        first = text.count("\n", 0, m.start()) + 2
        joined, start = "", None
        for k, line in enumerate(m.group(2).split("\n")):
            stripped = line.strip()
            if start is None:
                start = first + k
            if stripped.startswith("[") and out and not joined and not stripped.startswith("[ "):
                out[-1] = (out[-1][0], out[-1][1] + " " + stripped)  # a synopsis' second line
                start = None
                continue
            if stripped.endswith("\\"):
                joined += stripped[:-1] + " "
                continue
            joined += stripped
            if joined and not joined.startswith("#"):
                out.append((start, joined))
            joined, start = "", None
    return out


def words_of(command):
    try:
        return shlex.split(command, comments=True)
    except ValueError:
        return None


def split_chain(words):
    parts, cur = [], []
    for w in words:
        if w in ("&&", ";", "||"):
            parts.append(cur)
            cur = []
        else:
            cur.append(w)
    parts.append(cur)
    return [p for p in parts if p]


class Checker:
    def __init__(self, source, ndmini, mpiexec):
        self.source, self.ndmini, self.mpiexec = source, ndmini, mpiexec
        self.helps = {}
        self.failures = []
        self.counts = {"run": 0, "checked": 0, "parsed": 0, "not run": 0}
        self.seen = set()
        self.scratch = tempfile.mkdtemp(prefix="ndmini-docs-")
        with open(os.path.join(source, "CMakePresets.json")) as f:
            presets = json.load(f)
        self.presets = {p["name"] for kind in ("configurePresets", "buildPresets", "testPresets")
                        for p in presets.get(kind, [])}
        self.labels = None

    def help_of(self, sub):
        if sub not in self.helps:
            args = [self.ndmini] + sub.split() + ["--help"]
            r = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            self.helps[sub] = r.stdout + r.stderr
        return self.helps[sub]

    def suite_labels(self):
        if self.labels is None:
            build = os.path.dirname(os.path.dirname(os.path.abspath(self.ndmini)))
            r = subprocess.run(["ctest", "--test-dir", build, "--print-labels"], capture_output=True, text=True)
            self.labels = set(re.findall(r"^\s+(\S+)$", r.stdout, re.M))
        return self.labels

    def fail(self, where, command, why):
        self.failures.append(f"{where}: {command}\n    {why}")

    def verdict(self, kind, where, command, detail=""):
        self.counts[kind] += 1
        print(f"{kind:8} {where}: {command}" + (f"  [{detail}]" if detail else ""))

    # The options of `args` must be ones `ndmini sub --help` lists.
    def options_known(self, where, command, sub, args):
        text = self.help_of(sub)
        for a in args:
            if a.startswith("--"):
                flag = a.split("=", 1)[0].rstrip("]")
                if not re.search(r"(^|[\s,\[])" + re.escape(flag) + r"\b", text):
                    self.fail(where, command, f"ndmini {sub} --help lists no {flag}")
                    return False
        return True

    def ranks_of(self, launcher):
        """The ranks a launcher line asks for, or None."""
        n = nodes = per_node = None
        for k, w in enumerate(launcher):
            nxt = launcher[k + 1] if k + 1 < len(launcher) else ""
            if w in ("-n", "-np", "--ntasks"):
                n = int(nxt)
            elif w.startswith("--ntasks="):
                n = int(w.split("=")[1])
            elif w == "-N":
                nodes = int(nxt)
            elif w in ("--ntasks-per-node",):
                per_node = int(nxt)
        if n is None and nodes and per_node:
            n = nodes * per_node
        return n

    def ndmini_command(self, where, command, launcher, args):
        if not args:
            self.options_known(where, command, "", [])
            return self.verdict("parsed", where, command, "ndmini")
        sub = args[0] if not args[0].startswith("-") else ""
        rest = args[1:] if sub else args
        if sub == "ckpt" and rest and rest[0] in ("info", "verify"):
            sub, rest = "ckpt " + rest[0], rest[1:]
        shell = any("$" in w or "`" in w for w in args)
        placeholders = any(PLACEHOLDER.match(w) for w in rest)
        deck = rest[0] if rest and not rest[0].startswith("-") else None
        user_file = deck is not None and not os.path.exists(os.path.join(self.source, deck))
        if not self.options_known(where, command, sub, rest):
            return
        if shell or placeholders or user_file or "--calibrate" in rest or sub.startswith("ckpt") or not sub:
            return self.verdict("parsed", where, command, "options known to ndmini " + sub)
        ranks = self.ranks_of(launcher) if launcher else 1
        cluster = bool(launcher) and launcher[0] == "srun"
        if sub == "train" and (cluster or ranks > 2 or deck not in SMALL_DECKS):
            args = ["check", deck]
            k = 0
            while k < len(rest):
                if rest[k] == "--set":
                    args += rest[k:k + 2]
                    k += 2
                else:
                    k += 1
            return self.execute(where, command, "checked", [self.ndmini] + args + ["--world", str(ranks)],
                                f"ndmini check --world {ranks}")
        same = (ranks, tuple(args))  # the same run on two pages (README and parallelism.md): once
        if same in self.seen:
            return self.verdict("parsed", where, command, "run above")
        self.seen.add(same)
        full = [self.ndmini] + args + (["--set", "train.steps=2"] if sub == "train" else [])
        if ranks > 1 or sub == "train":
            full = [self.mpiexec, "-n", str(ranks)] + full
        self.execute(where, command, "run", full, " ".join(["-n", str(ranks)] + (["steps=2"] if sub == "train" else [])))

    def execute(self, where, command, kind, argv, detail):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        folder = tempfile.mkdtemp(dir=self.scratch)
        os.symlink(os.path.join(self.source, "inputs"), os.path.join(folder, "inputs"))
        start = time.monotonic()
        try:
            r = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            return self.fail(where, command, f"ran past {RUN_TIMEOUT_S} s: {' '.join(argv)}")
        if r.returncode != 0:
            tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
            return self.fail(where, command, f"exit {r.returncode}: {' '.join(argv)}\n    " + "\n    ".join(tail))
        self.verdict(kind, where, command, f"{detail}, {time.monotonic() - start:.1f} s")

    def other_command(self, where, command, words):
        program = words[0]
        if program not in KNOWN_PROGRAMS and not re.match(r"^\w+=", program):
            return self.fail(where, command, f"'{program}' is not a program the docs test knows (KNOWN_PROGRAMS)")
        for k, w in enumerate(words):
            if w == "--preset" and k + 1 < len(words) and words[k + 1] not in self.presets:
                return self.fail(where, command, f"no preset '{words[k + 1]}' in CMakePresets.json")
            if program == "ctest" and w == "-L" and k + 1 < len(words):
                if words[k + 1] not in self.suite_labels():
                    return self.fail(where, command, f"no test has the label '{words[k + 1]}'")
        if program.startswith(".") and not os.path.exists(os.path.join(self.source, program)):
            return self.fail(where, command, f"{program} does not exist")
        self.verdict("not run", where, command, "needs a build, root or a cluster")

    def script_command(self, where, command, words):
        path = os.path.join(self.source, words[0])
        if not os.access(path, os.X_OK):
            return self.fail(where, command, f"{words[0]} is not an executable file of the repository")
        r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        for w in words[1:]:
            if w.startswith("--") and w.split("=")[0] not in r.stdout:
                return self.fail(where, command, f"{words[0]} --help lists no {w.split('=')[0]}")
        self.verdict("parsed", where, command, f"options known to {words[0]} (the harness test runs its examples)")

    def command(self, where, line):
        words = words_of(line)
        if words is None:  # a fragment of a shell construct (if ...; then): its ndmini part
            words = line.replace('"', " ").replace("$(", " ").replace(")", " ").split()
        for part in split_chain(words):
            key = " ".join(part)
            if key in self.seen:
                continue
            self.seen.add(key)
            # env assignments and `env`, then a launcher, then the program
            k = 0
            while k < len(part) and (re.match(r"^[A-Z_][A-Z0-9_]*=", part[k]) or part[k] == "env"):
                k += 1
            body = part[k:]
            if not body:
                continue
            exe = next((i for i, w in enumerate(body) if os.path.basename(w) == "ndmini"), None)
            # ndmini itself, or launched (mpiexec, srun, a profiler under srun, a command substitution)
            if exe is not None and (exe == 0 or body[0] in LAUNCHERS or "$(" in line):
                launcher = body[:exe] if body[0] in LAUNCHERS else None
                if body[0] not in LAUNCHERS and exe != 0 and body[0] not in KNOWN_PROGRAMS and "$(" not in line:
                    self.fail(where, key, f"'{body[0]}' is not a program the docs test knows")
                    continue
                args = []
                for w in body[exe + 1:]:
                    if w in ("|", ">", "2>&1", ")") or w.startswith(">"):
                        break
                    args.append(w)
                self.ndmini_command(where, key, launcher, args)
            elif body[0].startswith("bench/"):
                self.script_command(where, key, body)
            else:
                self.other_command(where, key, body)


def main():
    source, ndmini, mpiexec = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    pages = sys.argv[4:] or (["README.md"] + sorted("docs/" + p for p in os.listdir(os.path.join(source, "docs"))
                                                    if p.endswith(".md")))
    checker = Checker(source, ndmini, mpiexec)
    start = time.monotonic()
    for page in pages:
        with open(os.path.join(source, page)) as f:
            for line_no, command in fenced_commands(f.read()):
                checker.command(f"{page}:{line_no}", command)
    summary = ", ".join(f"{v} {k}" for k, v in checker.counts.items())
    print(f"{summary}; {time.monotonic() - start:.1f} s")
    subprocess.run(["rm", "-rf", checker.scratch])
    if checker.failures:
        print(f"\n{len(checker.failures)} command(s) of the docs fail:\n" + "\n".join(checker.failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
