#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""CTest checks of the scaling harness (label harness).

  test_harness.py smoke      a 1- and 2-rank weak study of the tiny deck end to
                             end (files, columns, figures, provenance, ranks bound
                             to cores), a binding mpiexec cannot take refused, and a
                             point ndmini refuses recorded as failed with its message
  test_harness.py sbatch     the emitted batch scripts against the fixture in
                             fixtures/sbatch (paths replaced by @STUDY@ and @HARNESS@)
  test_harness.py slurm-run  the emitted scripts run for real with stand-ins for
                             srun and scontrol (srun -> mpiexec), then collect.sh

Environment: NDMINI (the executable), SOURCE_DIR (the repository), MPIEXEC.
UPDATE_FIXTURE=1 rewrites the fixture instead of comparing (after a deliberate change).
"""

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

SOURCE = os.environ.get("SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
HARNESS = os.path.join(SOURCE, "bench", "scaling")
SCALING = os.path.join(HARNESS, "scaling.py")
FIXTURE = os.path.join(HARNESS, "tests", "fixtures", "sbatch")
TINY = os.path.join(SOURCE, "inputs", "tiny.toml")
NDMINI = os.environ.get("NDMINI", os.path.join(SOURCE, "build", "miniapp", "ndmini"))

REQUIRED_COLUMNS = ["ranks", "layout", "mesh", "status", "global_batch", "tokens_per_s", "tokens_per_s_min",
                    "tokens_per_s_max", "tokens_per_s_per_rank", "speedup", "ideal_speedup", "efficiency",
                    "step_ms", "compute_ms", "exposed_comm_ms", "exposed_comm_share", "bubble_ms", "io_ms",
                    "mem_estimate_bytes", "peak_rss_bytes_rank0", "git_sha", "compiler", "kokkos", "mpi", "nccl",
                    "hosts", "slurm_job_id", "deck_sha256", "message"]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(cmd, env=None, expect=0):
    print("$ " + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    if expect is not None and out.returncode != expect:
        fail(f"exit {out.returncode}, expected {expect}: {' '.join(cmd)}")
    return out


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def check_study(study_dir, deck, n_rows, same_python=True):
    for name in ("study.json", "deck.toml", "results.csv", "results.md"):
        check(os.path.exists(os.path.join(study_dir, name)), f"missing {name} in {study_dir}")
    png = os.path.exists(os.path.join(study_dir, "scaling.png"))
    # The figure is optional: written exactly when matplotlib is there (collect.sh
    # runs the python3 on PATH, which may not be this one).
    check(not same_python or png == has_matplotlib(), f"scaling.png {'written' if png else 'missing'} with "
          f"matplotlib {'present' if has_matplotlib() else 'absent'}")
    rows = read_csv(os.path.join(study_dir, "results.csv"))
    check(len(rows) == n_rows, f"{len(rows)} rows in results.csv, expected {n_rows}")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    check(not missing, f"results.csv lacks columns {missing}")
    check(any(c.startswith("exposed_dp_replicate") for c in rows[0]), "no per-axis exposed comm column")
    with open(deck, "rb") as f:
        want_hash = hashlib.sha256(f.read()).hexdigest()
    for r in rows:
        check(r["deck_sha256"] == want_hash, f"deck_sha256 {r['deck_sha256']} is not the deck's {want_hash}")
        check(re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", r["git_sha"]) is not None, f"git_sha '{r['git_sha']}'")
        for col in ("compiler", "kokkos", "mpi", "hosts"):
            check(r[col].strip() != "", f"empty provenance column {col}")
    with open(os.path.join(study_dir, "results.md")) as f:
        md = f.read()
    check("| ranks | layout | tokens/s" in md and "Provenance:" in md, "results.md lacks the table or provenance")
    return rows


def smoke():
    work = tempfile.mkdtemp(prefix="ndmini-harness-")
    try:
        study_dir = os.path.join(work, "weak")
        run([sys.executable, SCALING, TINY, "--mode", "weak", "--ranks", "1,2", "--layout", "dp", "--steps", "6",
             "--warmup", "2", "--repeats", "2", "--exe", NDMINI, "--launcher", "mpiexec", "--out", study_dir])
        rows = check_study(study_dir, TINY, 2)
        one, two = rows
        check(one["status"] == "ok" and two["status"] == "ok", "a point failed")
        check((int(one["ranks"]), int(two["ranks"])) == (1, 2), "rows are not the 1- and 2-rank points")
        check(int(two["global_batch"]) == 2 * int(one["global_batch"]), "weak scaling must double the global batch")
        check(two["dp_replicate"] == "2" and two["layout"] == "dp_replicate=2", f"layout {two['layout']}")
        check(int(two["repeats_ok"]) == 2, "expected both repeats to succeed")
        tps1, tps2 = float(one["tokens_per_s"]), float(two["tokens_per_s"])
        check(tps1 > 0 and tps2 > 0, "tokens/s must be positive")
        check(abs(float(one["efficiency"]) - 1) < 1e-9, "the smallest point is the baseline (efficiency 1)")
        check(abs(float(two["speedup"]) - tps2 / tps1) < 1e-3 * tps2 / tps1, "speed-up is not the tokens/s ratio")
        check(abs(float(two["efficiency"]) - float(two["speedup"]) / 2) < 1e-4, "efficiency = speed-up / 2")
        check(abs(float(two["tokens_per_s_per_rank"]) - tps2 / 2) < 1e-3 * tps2, "tokens/s/rank = tokens/s / 2")
        check(float(two["tokens_per_s_min"]) <= tps2 <= float(two["tokens_per_s_max"]), "median outside min-max")
        # The breakdown adds up: compute + exposed comm (+ bubble + I/O) = step time.
        parts = sum(float(two[c]) for c in ("compute_ms", "exposed_comm_ms", "bubble_ms", "io_ms"))
        check(abs(parts - float(two["step_ms"])) < 0.05 * float(two["step_ms"]),
              f"compute + comm + bubble + I/O = {parts:.2f} ms, step {two['step_ms']} ms")
        check(float(two["exposed_dp_replicate_ms"]) > 0, "2-rank data parallelism must show dp_replicate time")
        # Each run's files are kept.
        for label in ("n0001_single", "n0002_dp_replicate2"):
            for rep in ("rep1", "rep2"):
                d = os.path.join(study_dir, "points", label, rep)
                for name in ("metrics.jsonl", "stdout.log", "exit_code", "command.txt", "build_info.json"):
                    check(os.path.exists(os.path.join(d, name)), f"missing {label}/{rep}/{name}")
        # Ranks are bound to cores by default, as under srun.
        with open(os.path.join(study_dir, "points", "n0002_dp_replicate2", "rep1", "command.txt")) as f:
            command = f.read()
        check(command.startswith("mpiexec -n 2 --bind-to core "), f"expected bound ranks: {command}")

        # A binding mpiexec cannot take is refused before anything runs.
        out = run([sys.executable, SCALING, TINY, "--mode", "weak", "--ranks", "1", "--layout", "dp", "--exe", NDMINI,
                   "--launcher", "mpiexec", "--cpu-bind", "map_cpu:0", "--out", os.path.join(work, "unbindable")],
                  expect=2)
        check("--cpu-bind map_cpu:0: under mpiexec give one of cores, threads, sockets, none" in out.stderr,
              f"unclear binding error: {out.stderr}")
        check(not os.path.exists(os.path.join(work, "unbindable")), "a refused study must write nothing")

        # A point ndmini refuses (tp=3 does not divide tiny's 4 heads) is a failed row with its message.
        bad_dir = os.path.join(work, "bad")
        run([sys.executable, SCALING, TINY, "--mode", "strong", "--point", "1:tp=1", "--point", "3:tp=3", "--steps",
             "4", "--warmup", "1", "--exe", NDMINI, "--launcher", "mpiexec", "--out", bad_dir], expect=1)
        rows = read_csv(os.path.join(bad_dir, "results.csv"))
        check([r["status"] for r in rows] == ["ok", "failed"], f"statuses {[r['status'] for r in rows]}")
        check("parallel.tp" in rows[1]["message"], f"the failure must name parallel.tp: {rows[1]['message']}")
        with open(os.path.join(bad_dir, "results.md")) as f:
            check("| 3 | tp=3 | failed |" in f.read(), "results.md must list the failed point")
        print("ok: weak study of 1 and 2 ranks on bound cores, a refused binding, and a failed point recorded")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def emit(study_dir, exe, extra):
    return run([sys.executable, SCALING, TINY, "--mode", "weak", "--exe", exe, "--emit-sbatch", study_dir,
                "--name", "fixture"] + extra)


FIXTURE_ARGS = ["--ranks", "4,8,16", "--layout", "tp=2,rest=dp_shard", "--set", "train.micro_batch=1", "--steps",
                "10", "--repeats", "2", "--ranks-per-node", "8", "--gpus-per-task", "1", "--cpus-per-task", "4",
                "--partition", "gpu", "--account", "proj42", "--time", "00:20:00", "--no-check"]


def emitted_files(study_dir):
    files = {}
    for root, _, names in os.walk(study_dir):
        for name in names:
            if name.endswith(".sbatch") or name in ("submit_all.sh", "collect.sh"):
                path = os.path.join(root, name)
                with open(path) as f:
                    text = f.read().replace(study_dir, "@STUDY@").replace(HARNESS, "@HARNESS@")
                files[os.path.relpath(path, study_dir)] = text
    return files


def sbatch():
    work = tempfile.mkdtemp(prefix="ndmini-sbatch-")
    try:
        study_dir = os.path.join(work, "study")
        emit(study_dir, "/opt/ndmini/bin/ndmini", FIXTURE_ARGS)
        got = emitted_files(study_dir)
        if os.environ.get("UPDATE_FIXTURE") == "1":
            shutil.rmtree(FIXTURE, ignore_errors=True)
            for rel, text in got.items():
                os.makedirs(os.path.dirname(os.path.join(FIXTURE, rel)), exist_ok=True)
                with open(os.path.join(FIXTURE, rel), "w") as f:
                    f.write(text)
            print(f"fixture rewritten: {FIXTURE}")
            return
        want = {}
        for root, _, names in os.walk(FIXTURE):
            for name in names:
                with open(os.path.join(root, name)) as f:
                    want[os.path.relpath(os.path.join(root, name), FIXTURE)] = f.read()
        check(sorted(got) == sorted(want), f"emitted {sorted(got)}, fixture has {sorted(want)}")
        for rel in sorted(want):
            if got[rel] != want[rel]:
                import difflib
                sys.stderr.writelines(difflib.unified_diff(want[rel].splitlines(True), got[rel].splitlines(True),
                                                           "fixture/" + rel, "emitted/" + rel))
                fail(f"{rel} differs from the fixture (UPDATE_FIXTURE=1 rewrites it after a deliberate change)")
        # What the fixture pins down, spelled out: placement per point.
        for rel, nodes, tasks in (("n0004_dp_shard2_tp2", 1, 4), ("n0008_dp_shard4_tp2", 1, 8),
                                  ("n0016_dp_shard8_tp2", 2, 8)):
            text = got[os.path.join("points", rel, "job.sbatch")]
            check(f"#SBATCH --nodes={nodes}\n" in text and f"#SBATCH --ntasks-per-node={tasks}\n" in text,
                  f"{rel}: expected {nodes} node(s) of {tasks} tasks")
        # pp x tp with the rest on dp_replicate: the degrees reach ndmini as they are
        # (today's ndmini refuses pp > 1; the harness does not second-guess it).
        pp_dir = os.path.join(work, "pp")
        emit(pp_dir, "/opt/ndmini/bin/ndmini", ["--ranks", "8", "--layout", "pp=2,tp=2", "--no-check"])
        with open(os.path.join(pp_dir, "points", "n0008_pp2_dp_replicate2_tp2", "job.sbatch")) as f:
            text = f.read()
        for want in ("--set parallel.pp=2", "--set parallel.dp_replicate=2", "--set parallel.tp=2",
                     "--set parallel.dp_shard=1", "--set train.global_batch=8"):
            check(want in text, f"the pp=2,tp=2 point must pass '{want}'")
        print(f"ok: {len(got)} emitted files match the fixture; pp x tp degrees passed through")
    finally:
        shutil.rmtree(work, ignore_errors=True)


FAKE_SRUN = """#!/bin/bash
# Stand-in for srun: the --ntasks of a step, through mpiexec; other options ignored.
n=1
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in --ntasks=*) n=${1#--ntasks=} ;; -n) n=$2; shift ;; esac
  shift
done
exec "$MPIEXEC" -n "$n" "$@"
"""
FAKE_SCONTROL = """#!/bin/bash
# Stand-in for 'scontrol show hostnames': this host.
hostname
"""


def slurm_run():
    work = tempfile.mkdtemp(prefix="ndmini-slurm-")
    try:
        bindir = os.path.join(work, "bin")
        os.makedirs(bindir)
        for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
            with open(os.path.join(bindir, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(bindir, name), 0o755)
        study_dir = os.path.join(work, "study")
        emit(study_dir, NDMINI, ["--ranks", "1,2", "--layout", "fsdp", "--steps", "5", "--warmup", "1"])
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="4242",
                   SLURM_JOB_NODELIST="fake[1]", MPIEXEC=os.environ.get("MPIEXEC", "mpiexec"))
        with open(os.path.join(study_dir, "submit_all.sh")) as f:
            scripts = [line.split(" ", 1)[1].strip().strip("'") for line in f if line.startswith("sbatch ")]
        check(len(scripts) == 2, f"submit_all.sh submits {len(scripts)} scripts, expected 2")
        for script in scripts:
            run(["bash", script], env=env)  # what sbatch would run (#SBATCH lines are comments to bash)
        run([os.path.join(study_dir, "collect.sh")])
        rows = check_study(study_dir, TINY, 2, same_python=False)
        check(all(r["status"] == "ok" for r in rows), f"statuses {[r['status'] for r in rows]}")
        check(all(r["slurm_job_id"] == "4242" for r in rows), "the Slurm job id must be recorded")
        check(rows[1]["layout"] == "dp_shard=2", f"layout {rows[1]['layout']}")
        check(float(rows[1]["exposed_fsdp_ms"]) > 0, "2-rank FSDP must show fsdp time")
        with open(os.path.join(study_dir, "points", rows[1]["label"], "rep1", "build_info.json")) as f:
            check(json.load(f).get("name") == "ndmini", "build_info.json must hold ndmini --build-info")
        print("ok: emitted scripts ran (srun stand-in) and collect.sh built the table")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    cases = {"smoke": smoke, "sbatch": sbatch, "slurm-run": slurm_run}
    if len(sys.argv) != 2 or sys.argv[1] not in cases:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(cases)}")
    cases[sys.argv[1]]()
