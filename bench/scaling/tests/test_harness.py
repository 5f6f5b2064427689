#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""CTest checks of the scaling harness (label harness).

  test_harness.py smoke      a 1- and 2-rank weak study of the tiny deck end to
                             end (files, columns, figures, provenance, ranks bound
                             to cores), a binding mpiexec cannot take refused, and a
                             point ndmini refuses recorded as refused with its message
  test_harness.py batch      each point's global batch and micro-batch (weak: the
                             deck's batch per data-parallel rank kept; strong: the
                             global batch kept, the micro-batch fitted or given), and
                             points refused for their batch: the others still run or
                             are emitted, the study exits 1 unless --allow-missing
  test_harness.py sbatch     the emitted batch scripts against the fixture in
                             fixtures/sbatch (paths replaced by @STUDY@ and @HARNESS@)
  test_harness.py slurm-run  the emitted scripts run for real with stand-ins for
                             srun and scontrol (srun -> mpiexec), a run stopped with a
                             checkpoint resumed by the next job, then collect.sh
  test_harness.py blas       --blas-coretype (auto|keep|NAME; a bad value refused,
                             nothing written): the local decision on fake `ndmini
                             check` outputs and environments, the batch scripts'
                             snippet run with a stand-in srun, and a 1-rank study
                             whose run gets the kernel asked for (recorded)
  test_harness.py predict    --cluster/--predict-to: the predicted columns equal what
                             `ndmini plan --json` says of each point; a weak study carried on
                             to 1024 H100s (rank counts, batches, monotone steps and
                             efficiencies); a strong extension refused past its batch; a
                             cluster too small (does not fit); a point the planner
                             refuses; collect.py offline and with --cluster; bad
                             combinations refused with one message, nothing written
  test_harness.py bad-paths  every path argument checked before it is opened: a
                             FIFO deck or cluster file (open() would wait forever),
                             --out naming a file or a FIFO, a deck over 1 MiB, and
                             --predict-to past ndmini's 2^20 ranks: one
                             `scaling.py: error:` line, exit 2, nothing written, each
                             within a time bound
  test_harness.py examples-help, examples-readme
                             every scaling.py example of --help / bench/README.md:
                             planned as written through --emit-sbatch (every point
                             emitted, batches by the rule), and the local ones run on
                             their points of at most 2 ranks, a few steps each

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
import shlex
import tempfile
import tomllib

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


def run(cmd, env=None, expect=0, cwd=None):
    print(("$ " if cwd is None else f"$ (in {cwd}) ") + " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
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
    check("| ranks | layout | batch: global / micro | tokens/s" in md and "Provenance:" in md,
          "results.md lacks the table or provenance")
    return rows


def smoke():
    work = tempfile.mkdtemp(prefix="ndmini-harness-")
    try:
        study_dir = os.path.join(work, "weak")
        out = run([sys.executable, SCALING, TINY, "--mode", "weak", "--ranks", "1,2", "--layout", "dp", "--steps",
                   "6", "--warmup", "2", "--repeats", "2", "--exe", NDMINI, "--launcher", "mpiexec", "--out",
                   study_dir])
        check("scaling.py: 2 of 2 points measured\n" in out.stderr, "the summary line must count the points")
        rows = check_study(study_dir, TINY, 2)
        one, two = rows
        check(one["status"] == "ok" and two["status"] == "ok", "a point failed")
        check((int(one["ranks"]), int(two["ranks"])) == (1, 2), "rows are not the 1- and 2-rank points")
        # tiny.toml: global batch 8 on one data-parallel rank, so 8 per data-parallel rank.
        check((one["global_batch"], two["global_batch"]) == ("8", "16"), "weak scaling: 8 sequences per dp rank")
        check(one["micro_batch"] == two["micro_batch"] == "4", "the deck's micro-batch fits 8 per rank")
        with open(os.path.join(study_dir, "results.md")) as f:
            check("weak scaling: a fixed batch per data-parallel rank (8 sequences; global batch = 8 x dp_replicate "
                  "x dp_shard of each point)" in f.read(), "results.md must state the weak batch rule")
        check(two["dp_replicate"] == "2" and two["layout"] == "dp_replicate=2", f"layout {two['layout']}")
        check(int(two["repeats_ok"]) == 2, "expected both repeats to succeed")
        tps1, tps2 = float(one["tokens_per_s"]), float(two["tokens_per_s"])
        check(tps1 > 0 and tps2 > 0, "tokens/s must be positive")
        check(abs(float(one["efficiency"]) - 1) < 1e-9, "the smallest point is the baseline (efficiency 1)")
        check(abs(float(two["speedup"]) - tps2 / tps1) < 1e-3 * tps2 / tps1, "speed-up is not the tokens/s ratio")
        check(abs(float(two["efficiency"]) - float(two["speedup"]) / 2) < 1e-4, "efficiency = speed-up / 2")
        check(abs(float(two["tokens_per_s_per_rank"]) - tps2 / 2) < 1e-3 * tps2, "tokens/s/rank = tokens/s / 2")
        check(float(two["tokens_per_s_min"]) <= tps2 <= float(two["tokens_per_s_max"]), "median outside min-max")
        # The breakdown adds up: compute + exposed comm (+ bubble + I/O) = step time, step by step; each
        # figure is a median of its own, so on a busy machine they add up within the steps' spread.
        parts = sum(float(two[c]) for c in ("compute_ms", "exposed_comm_ms", "bubble_ms", "io_ms"))
        spread = (float(two["step_ms_max"]) - float(two["step_ms_min"]) + float(two["step_ms_p75"]) -
                  float(two["step_ms_p25"]))
        check(abs(parts - float(two["step_ms"])) < 0.05 * float(two["step_ms"]) + spread,
              f"compute + comm + bubble + I/O = {parts:.2f} ms, step {two['step_ms']} ms (spread {spread:.2f} ms)")
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

        # A point ndmini refuses (tp=3 does not divide tiny's 4 heads) is a refused row with its message.
        bad_dir = os.path.join(work, "bad")
        out = run([sys.executable, SCALING, TINY, "--mode", "strong", "--point", "1:tp=1", "--point", "3:tp=3",
                   "--steps", "4", "--warmup", "1", "--exe", NDMINI, "--launcher", "mpiexec", "--out", bad_dir],
                  expect=1)
        check("scaling.py: 1 of 2 points measured, 1 refused (n0003_tp3: " in out.stderr,
              "the summary line must count the refused point and give its reason")
        rows = read_csv(os.path.join(bad_dir, "results.csv"))
        check([r["status"] for r in rows] == ["ok", "refused"], f"statuses {[r['status'] for r in rows]}")
        check("parallel.tp" in rows[1]["message"], f"the refusal must name parallel.tp: {rows[1]['message']}")
        check(not os.path.exists(os.path.join(bad_dir, "points", "n0003_tp3", "rep1", "metrics.jsonl")),
              "a refused point must not run")
        with open(os.path.join(bad_dir, "results.md")) as f:
            check("| 3 | tp=3 | 8 / 4 | refused |" in f.read(), "results.md must list the refused point")
        print("ok: weak study of 1 and 2 ranks on bound cores, a refused binding, and a refused point recorded")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def emit(study_dir, exe, extra, expect=0):
    """An emitted study of tiny.toml; weak unless extra gives --mode (argparse keeps the last)."""
    return run([sys.executable, SCALING, TINY, "--mode", "weak", "--exe", exe, "--emit-sbatch", study_dir,
                "--name", "fixture"] + extra, expect=expect)


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
        # What the fixture pins down, spelled out: placement and batch per point (tiny.toml: 8 sequences per
        # data-parallel rank, micro-batch 1 by --set), the signal before the time limit, and the resume.
        for rel, nodes, tasks, batch in (("n0004_dp_shard2_tp2", 1, 4, 16), ("n0008_dp_shard4_tp2", 1, 8, 32),
                                         ("n0016_dp_shard8_tp2", 2, 8, 64)):
            text = got[os.path.join("points", rel, "job.sbatch")]
            check(f"#SBATCH --nodes={nodes}\n" in text and f"#SBATCH --ntasks-per-node={tasks}\n" in text,
                  f"{rel}: expected {nodes} node(s) of {tasks} tasks")
            check(f"--set train.global_batch={batch} --set train.micro_batch=1 " in text,
                  f"{rel}: expected global batch {batch}, micro-batch 1")
            check("#SBATCH --signal=USR1@120\n" in text, f"{rel}: no SIGUSR1 120 s before the time limit")
            check('if [[ -e "$run/ckpt/latest" ]]; then' in text and " $resume > " in text,
                  f"{rel}: --resume must depend on the checkpoint's 'latest'")
        # --signal-grace sets the lead; 0 asks for no signal.
        for grace, want in (("300", "#SBATCH --signal=USR1@300\n"), ("0", None)):
            gdir = os.path.join(work, f"grace{grace}")
            emit(gdir, "/opt/ndmini/bin/ndmini", ["--ranks", "2", "--layout", "dp", "--no-check", "--signal-grace",
                                                 grace])
            with open(os.path.join(gdir, "points", "n0002_dp_replicate2", "job.sbatch")) as f:
                text = f.read()
            if want:
                check(want in text, f"--signal-grace {grace}: expected {want.strip()}")
            else:
                check("--signal" not in text, "--signal-grace 0 must ask for no signal")
        # A lead as long as the time limit would stop every run at its start: refused.
        out = emit(os.path.join(work, "short"), "/opt/ndmini/bin/ndmini", ["--ranks", "2", "--layout", "dp",
                                                                          "--no-check", "--time", "2"], expect=2)
        check("--signal-grace 120 s is not less than --time 2 (120 s)" in out.stderr, f"unclear: {out.stderr}")
        check(not os.path.exists(os.path.join(work, "short")), "a refused study must write nothing")
        # pp x tp with the rest on dp_replicate: the degrees reach ndmini as they are, and the
        # global batch is 8 per data-parallel rank times dp_replicate = 2.
        pp_dir = os.path.join(work, "pp")
        emit(pp_dir, "/opt/ndmini/bin/ndmini", ["--ranks", "8", "--layout", "pp=2,tp=2", "--no-check"])
        with open(os.path.join(pp_dir, "points", "n0008_pp2_dp_replicate2_tp2", "job.sbatch")) as f:
            text = f.read()
        for want in ("--set parallel.pp=2", "--set parallel.dp_replicate=2", "--set parallel.tp=2",
                     "--set parallel.dp_shard=1", "--set train.global_batch=16"):
            check(want in text, f"the pp=2,tp=2 point must pass '{want}'")
        # Collected before any job is submitted: every point "not run" (not "failed"), exit 1. Then one
        # point's two runs given metrics files that open with a header record (`"record": "header"`,
        # as ndmini may write first): read past it, that point measured, the others still not run.
        collect = [sys.executable, os.path.join(HARNESS, "collect.py"), study_dir]
        out = run(collect, expect=1)
        check("collect.py: 0 of 3 points measured, 3 not run" in out.stderr, f"unsubmitted points: {out.stderr}")
        check(all(r["status"] == "not run" for r in read_csv(os.path.join(study_dir, "results.csv"))),
              "unsubmitted points must read 'not run'")
        header = {"record": "header", "version": "0.0", "git_sha": "0" * 40, "deck": "tiny.toml",
                  "config": {"train": {"steps": 10}}, "host": "node1", "start_time": "2026-12-04T00:00:00Z"}
        for rep in ("rep1", "rep2"):
            rep_dir = os.path.join(study_dir, "points", "n0004_dp_shard2_tp2", rep)
            os.makedirs(rep_dir)
            with open(os.path.join(rep_dir, "metrics.jsonl"), "w") as f:
                f.write(json.dumps(header) + "\n")
                for step in range(10):
                    f.write(json.dumps({"step": step, "loss": 5.0, "step_ms": 20.0 + step % 2, "tokens_per_s": 1000.0,
                                        "mfu": 0.1, "mem_bytes": 1, "comm": {}}) + "\n")
                f.write(json.dumps({"summary": True, "peak_rss_bytes": 1, "state_bytes": 1, "io_ms": 0.0}) + "\n")
            with open(os.path.join(rep_dir, "exit_code"), "w") as f:
                f.write("0\n")
        out = run(collect, expect=1)
        check("collect.py: 1 of 3 points measured, 2 not run" in out.stderr, f"with a header record: {out.stderr}")
        rows = {r["label"]: r for r in read_csv(os.path.join(study_dir, "results.csv"))}
        # Steps 20, 21, 20, ... ms: the median of the 8 after the 2 warm-up steps is 20.5; a header taken for a
        # step would shift them (21).
        measured_row = rows["n0004_dp_shard2_tp2"]
        check(measured_row["status"] == "ok" and measured_row["tokens_per_s"] == "1000" and
              measured_row["step_ms"] == "20.5", f"the point whose metrics open with a header record: {measured_row}")
        # --emit-sbatch --cluster prints what it predicted, one line per point, before anything runs.
        here = os.path.join(SOURCE, "inputs", "clusters", "here.toml")
        out = emit(os.path.join(work, "predicted"), NDMINI, ["--ranks", "1,2", "--layout", "dp", "--cluster", here])
        lines = [line for line in out.stdout.splitlines() if " ranks " in line and "here: " in line]
        check("predicted by ndmini plan" in out.stdout and len(lines) == 2 and all("ms/step" in x for x in lines),
              f"--emit-sbatch --cluster must print its 2 predictions: {out.stdout}")
        print(f"ok: {len(got)} emitted files match the fixture; pp x tp degrees passed through; unsubmitted points "
              f"not run; a header record read past; the predictions of --emit-sbatch --cluster printed")
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


def run_jobs(scripts, env, job_id, expect):
    """Runs every point's batch script as sbatch would (#SBATCH lines are comments to bash)."""
    return [run(["bash", script], env=dict(env, SLURM_JOB_ID=job_id), expect=expect) for script in scripts]


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
        # Checkpoints every 2 steps, so that a run stopped at step 3 has one to resume from.
        emit(study_dir, NDMINI, ["--ranks", "1,2", "--layout", "fsdp", "--steps", "5", "--warmup", "1", "--repeats",
                                 "2", "--set", "checkpoint.every=2", "--set", "perf.peak_gflops=100"])
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"], SLURM_JOB_NODELIST="fake[1]",
                   MPIEXEC=os.environ.get("MPIEXEC", "mpiexec"))
        with open(os.path.join(study_dir, "submit_all.sh")) as f:
            scripts = [line.split(" ", 1)[1].strip().strip("'") for line in f if line.startswith("sbatch ")]
        check(len(scripts) == 2, f"submit_all.sh submits {len(scripts)} scripts, expected 2")
        points = [os.path.dirname(script) for script in scripts]

        # Job 4241 ends early: a stand-in for SIGUSR1 before the time limit, rank 0 dies at step 3 after the
        # checkpoint of step 2 (the study's copy of the deck carries the fault for this job only).
        deck = os.path.join(study_dir, "deck.toml")
        with open(deck) as f:
            deck_text = f.read()
        with open(deck, "a") as f:
            f.write("\n[fault]\nkind = \"kill\"\nrank = 0\nstep = 3\n")
        for point, out in zip(points, run_jobs(scripts, env, "4241", expect=None)):
            check(out.returncode != 0, f"{point}: a job whose run stopped must exit non-zero")
            check("rep1 stopped at a checkpoint" in out.stderr and "job.sbatch again to resume" in out.stderr,
                  f"{point}: the job must say how to resume: {out.stderr}")
            check(os.path.exists(os.path.join(point, "rep1", "ckpt", "latest")), f"{point}: no checkpoint")
            check(not os.path.exists(os.path.join(point, "rep2")), f"{point}: rep2 must wait for the next job")
        with open(deck, "w") as f:
            f.write(deck_text)

        # Job 4242 resumes rep1 from 'latest' (step 2), keeps job 4241's files aside, and runs rep2 afresh.
        run_jobs(scripts, env, "4242", expect=0)
        for point in points:
            log = read_text(os.path.join(point, "rep1", "stdout.log"))
            check("checkpoint: resumed from" in log and " at step 2 " in log, f"{point}: rep1 did not resume")
            check("fault: kill fired" in read_text(os.path.join(point, "rep1", "interrupted-4241", "stderr.log")),
                  f"{point}: job 4241's log must be kept aside")
            check("resumed" not in read_text(os.path.join(point, "rep2", "stdout.log")),
                  f"{point}: rep2 had no checkpoint to resume from")
        # Job 4243 finds every repeat finished and runs nothing again.
        run_jobs(scripts, env, "4243", expect=0)
        for point in points:
            for rep in ("rep1", "rep2"):
                check(read_text(os.path.join(point, rep, "slurm_job_id")) == "4242",
                      f"{point}/{rep}: a finished repeat must not run again")

        run([os.path.join(study_dir, "collect.sh")])
        rows = check_study(study_dir, TINY, 2, same_python=False)
        check(all(r["status"] == "ok" for r in rows), f"statuses {[r['status'] for r in rows]}")
        check(all(r["slurm_job_id"] == "4242" for r in rows), "the Slurm job id must be recorded")
        check(rows[1]["layout"] == "dp_shard=2", f"layout {rows[1]['layout']}")
        check(float(rows[1]["exposed_fsdp_ms"]) > 0, "2-rank FSDP must show fsdp time")
        with open(os.path.join(study_dir, "points", rows[1]["label"], "rep1", "build_info.json")) as f:
            check(json.load(f).get("name") == "ndmini", "build_info.json must hold ndmini --build-info")
        print("ok: emitted scripts ran (srun stand-in), a stopped run resumed in the next job, finished repeats "
              "kept, and collect.sh built the table")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def read_text(path):
    with open(path) as f:
        return f.read().strip()


# --- The examples of --help and bench/README.md ----------------------------------------

LOCAL_RANKS = 2  # the most ranks a local example runs with here


def example_commands(text):
    """The scaling.py command lines of a text (backslash continuations joined), as argument lists."""
    commands, pending = [], None
    for line in text.splitlines():
        line = line.strip()
        if pending is None and not line.startswith("bench/scaling/scaling.py "):
            continue
        pending = (pending + " " if pending else "") + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            commands.append(shlex.split(pending)[1:])
            pending = None
    return commands


def option_values(args, name):
    """The values of an option given as NAME VALUE (every occurrence)."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]


def without(args, *names):
    """args less every NAME VALUE pair of the given options."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in names:
            skip = True
        else:
            out.append(a)
    return out


def expected_points(args):
    """The rank count of every point an example plans, read from its arguments."""
    if option_values(args, "--point"):
        return [int(p.split(":", 1)[0]) for p in option_values(args, "--point")]
    return sorted({int(r) for r in option_values(args, "--ranks")[-1].split(",")})


def run_examples(where, commands, least):
    check(len(commands) >= least, f"{len(commands)} scaling.py examples found in {where}, expected {least} or more")
    work = tempfile.mkdtemp(prefix="ndmini-examples-")
    try:
        for k, args in enumerate(commands):
            print(f"--- example {k + 1} of {where}: scaling.py {shlex.join(args)}", flush=True)
            mode = option_values(args, "--mode")[-1]
            deck = os.path.join(SOURCE, args[0])
            sets = option_values(args, "--set")
            # As written, through --emit-sbatch: every point passes `ndmini check` and gets its batch script.
            plan_dir = os.path.join(work, f"plan{k}")
            ranks = expected_points(args)
            out = run([sys.executable, SCALING] + without(args, "--out", "--emit-sbatch") +
                  ["--emit-sbatch", plan_dir, "--exe", NDMINI], cwd=SOURCE)
            n = len(ranks)
            check(f"scaling.py: {n} of {n} points emitted\n" in out.stderr, f"example {k + 1}: not every point emitted")
            check(len(planned_points(plan_dir)) == n and all(os.path.exists(os.path.join(p["dir"], "job.sbatch"))
                                                              for p in planned_points(plan_dir)),
                  f"example {k + 1}: expected {n} batch scripts")
            check_batch_rule(plan_dir, mode, deck, sets, micro=(int(option_values(args, "--micro-batch")[-1])
                                                                if "--micro-batch" in args else None))
            if "--emit-sbatch" in args:
                continue  # a cluster example: its batch scripts are what it makes
            # Locally: its points of at most LOCAL_RANKS ranks, 2 steps each (the warm-up and one timed), one run;
            # a collective stuck for a minute ends the run with ndmini's diagnosis (comm.timeout_s) instead of the
            # test's timeout.
            local = without(args, "--out", "--ranks", "--point", "--steps", "--warmup", "--repeats")
            if "--point" in args:
                kept = [p for p in option_values(args, "--point") if int(p.split(":", 1)[0]) <= LOCAL_RANKS]
                local += [a for p in kept for a in ("--point", p)]
            else:
                kept = [r for r in ranks if r <= LOCAL_RANKS]
                local += ["--ranks", ",".join(map(str, kept))]
            check(kept, f"example {k + 1}: no point of at most {LOCAL_RANKS} ranks to run here")
            run_dir = os.path.join(work, f"run{k}")
            out = run([sys.executable, SCALING] + local + [
                "--steps", "2", "--warmup", "1", "--repeats", "1", "--set", "perf.peak_gflops=100", "--set",
                "comm.timeout_s=60", "--exe", NDMINI, "--launcher", "mpiexec", "--out", run_dir], cwd=SOURCE)
            m = len(kept)
            check(f"scaling.py: {m} of {m} points measured\n" in out.stderr, f"example {k + 1}: not every point ran")
            rows = [r for r in read_csv(os.path.join(run_dir, "results.csv"))
                    if r.get("kind", "measured") == "measured"]  # not the rows predicted only
            check(len(rows) == m and all(r["status"] == "ok" and float(r["tokens_per_s"]) > 0 for r in rows),
                  f"example {k + 1}: statuses {[r['status'] for r in rows]}")
            check_batch_rule(run_dir, mode, deck, sets)
        print(f"ok: {len(commands)} examples of {where} planned with every point, the local ones run")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def examples_help():
    text = subprocess.run([sys.executable, SCALING, "--help"], capture_output=True, text=True, check=True).stdout
    run_examples("scaling.py --help", example_commands(text), 4)


def examples_readme():
    with open(os.path.join(SOURCE, "bench", "README.md")) as f:
        run_examples("bench/README.md", example_commands(f.read()), 4)


# --- Batch sizes ---------------------------------------------------------------------


def deck_numbers(deck, overrides=()):
    """(global batch, micro-batch, data-parallel degree) of a deck after --set overrides."""
    with open(deck, "rb") as f:
        d = tomllib.load(f)
    values = {"train.global_batch": d.get("train", {}).get("global_batch", 8),
              "train.micro_batch": d.get("train", {}).get("micro_batch", 4),
              "parallel.dp_replicate": d.get("parallel", {}).get("dp_replicate", 1),
              "parallel.dp_shard": d.get("parallel", {}).get("dp_shard", 1)}
    for o in overrides:
        key, _, value = o.partition("=")
        if key in values:
            values[key] = int(value)
    return (values["train.global_batch"], values["train.micro_batch"],
            values["parallel.dp_replicate"] * values["parallel.dp_shard"])


def planned_points(study_dir):
    with open(os.path.join(study_dir, "study.json")) as f:
        return json.load(f)["points"]


def check_batch_rule(study_dir, mode, deck, overrides=(), micro=None):
    """Every point's global batch and micro-batch against the rule, worked out here from the deck."""
    deck_batch, deck_micro, deck_dp = deck_numbers(deck, overrides)
    for p in planned_points(study_dir):
        dp = p["degrees"]["dp_replicate"] * p["degrees"]["dp_shard"]
        want = deck_batch // deck_dp * dp if mode == "weak" else deck_batch
        check(p["global_batch"] == want, f"{p['label']}: global batch {p['global_batch']}, the rule gives {want}")
        per_rank = want // dp
        want_micro = micro or max(m for m in range(1, deck_micro + 1) if per_rank % m == 0)
        check(p["micro_batch"] == want_micro, f"{p['label']}: micro-batch {p['micro_batch']}, expected {want_micro}")
        if "precheck_error" not in p:  # what the run gets: its batch script, or its command line
            script = os.path.join(p["dir"], "job.sbatch")
            text = read_text(script if os.path.exists(script) else os.path.join(p["dir"], "rep1", "command.txt"))
            check(f"train.global_batch={want}" in text and f"train.micro_batch={want_micro}" in text,
                  f"{p['label']}: the run must get global batch {want} and micro-batch {want_micro}")


def batch():
    work = tempfile.mkdtemp(prefix="ndmini-batch-")
    try:
        # Weak: a deck sized for dp_shard=2 (tiny's 8 sequences: 4 per data-parallel rank); tp ranks share theirs.
        d = os.path.join(work, "weak")
        sets = ["--set", "parallel.dp_shard=2"]
        points = ["--point", "1:tp=1", "--point", "2:dp_replicate=2", "--point", "2:tp=2", "--point",
                  "4:dp_shard=2,tp=2"]
        out = emit(d, NDMINI, points + sets)
        check("scaling.py: 4 of 4 points emitted\n" in out.stderr, "all four weak points must be emitted")
        check([p["global_batch"] for p in planned_points(d)] == [4, 8, 4, 8], "weak: 4 sequences per dp rank")
        check_batch_rule(d, "weak", TINY, ["parallel.dp_shard=2"])
        # A deck whose data-parallel degree is 'the rest' has no batch per rank: refused before anything.
        out = emit(os.path.join(work, "rest"), NDMINI, ["--ranks", "2", "--layout", "dp", "--set",
                                                        "parallel.dp_shard=-1"], expect=2)
        check("parallel.dp_shard = -1" in out.stderr and "--set parallel.dp_shard=N" in out.stderr,
              f"unclear refusal of a -1 degree: {out.stderr}")

        # Strong: global batch 12 kept; micro-batch the largest divisor of 12 / dp not above the deck's 4.
        d = os.path.join(work, "strong")
        sets = ["--set", "train.global_batch=12"]
        emit(d, NDMINI, ["--mode", "strong", "--ranks", "1,2,4", "--layout", "fsdp"] + sets)
        check([p["micro_batch"] for p in planned_points(d)] == [4, 3, 3], "strong: micro-batches 4, 3, 3")
        check_batch_rule(d, "strong", TINY, ["train.global_batch=12"])

        # --micro-batch 2 for every point: 3 sequences per rank (4 ranks) cannot take it, that point is refused
        # and the others emitted; exit 1, or 0 with --allow-missing.
        for allow, code in (([], 1), (["--allow-missing"], 0)):
            d = os.path.join(work, f"micro{len(allow)}")
            out = emit(d, NDMINI, ["--mode", "strong", "--ranks", "1,2,4", "--layout", "fsdp", "--micro-batch", "2"]
                       + sets + allow, expect=code)
            check("scaling.py: 2 of 3 points emitted, 1 refused (n0004_dp_shard4: --micro-batch 2 does not divide "
                  "the 3 sequences" in out.stderr, f"the summary must count and explain the refusal: {out.stderr}")
            check(("exit 1 (--allow-missing" in out.stderr) == (not allow), "the exit hint goes with the exit code")
            check(sorted(os.listdir(os.path.join(d, "points", "n0004_dp_shard4"))) == ["point.json", "rep1"],
                  "a refused point has no batch script")
            with open(os.path.join(d, "submit_all.sh")) as f:
                check(f.read().count("sbatch ") == 2, "submit_all.sh must submit the 2 emitted points")
            check_batch_rule(d, "strong", TINY, ["train.global_batch=12"], micro=2)
        # Every point refused: nothing to submit, exit 1 even with --allow-missing.
        out = emit(os.path.join(work, "none"), NDMINI, ["--mode", "strong", "--ranks", "1,2", "--layout", "dp",
                                                        "--micro-batch", "3", "--allow-missing"], expect=1)
        check("scaling.py: 0 of 2 points emitted, 2 refused" in out.stderr, "all refused must say 0 of 2")

        # Locally: a global batch of 8 that 3 data-parallel ranks cannot share. The 1-rank point still runs, the
        # table gives the reason, the study exits 1; with --allow-missing 0.
        for allow, code in (([], 1), (["--allow-missing"], 0)):
            d = os.path.join(work, f"local{len(allow)}")
            out = run([sys.executable, SCALING, TINY, "--mode", "strong", "--ranks", "1,3", "--layout", "dp",
                       "--steps", "3", "--warmup", "1", "--set", "perf.peak_gflops=100", "--exe", NDMINI,
                       "--launcher", "mpiexec", "--out", d] + allow, expect=code)
            check("scaling.py: 1 of 2 points measured, 1 refused (n0003_dp_replicate3: strong scaling keeps the "
                  "global batch of 8 sequences, which 3 data-parallel ranks" in out.stderr,
                  f"the summary must count and explain the refusal: {out.stderr}")
            rows = read_csv(os.path.join(d, "results.csv"))
            check([r["status"] for r in rows] == ["ok", "refused"], f"statuses {[r['status'] for r in rows]}")
            check("--global-batch a multiple of 3" in rows[1]["message"], f"message {rows[1]['message']}")
            with open(os.path.join(d, "results.md")) as f:
                md = f.read()
            check("strong scaling: a fixed global batch (8 sequences; the micro-batch fitted to each point)" in md,
                  "results.md must state the strong batch rule")
            check("| 3 | dp_replicate=3 | 8 / 4 | refused | | | | | strong scaling keeps" in md,
                  "results.md must list the refused point with its reason")
            check(not os.path.exists(os.path.join(d, "points", "n0003_dp_replicate3", "rep1", "command.txt")),
                  "a refused point must not run")
            # collect.py rebuilds the same table with the same verdict.
            run([sys.executable, os.path.join(HARNESS, "collect.py"), d], expect=code)
        print("ok: weak and strong batches follow the rule; refused points listed, the rest run; exit codes")
    finally:
        shutil.rmtree(work, ignore_errors=True)


WARNING = ("warning: OpenBLAS runs its Prescott kernel on a CPU with AVX-512: fp32 products ... run well below this "
           "CPU's speed (...). Fix: export OPENBLAS_CORETYPE=Cooperlake before the run (in the batch script, or srun "
           "--export=ALL,OPENBLAS_CORETYPE=Cooperlake)\n")
GEMM_LINE = "gemm: OpenBLAS 0.3.21 kernel Prescott, 1 thread | oneDNN 2.6.3, ISA avx512_core_bf16, 1 thread (OpenMP)\n"


def snippet_coretype(script, srun_output, preset):
    """OPENBLAS_CORETYPE after a batch script's lines up to its run loop, with a stand-in srun that prints
    srun_output (as `ndmini check` would) and the variable preset (None: unset) in that shell only."""
    with open(script) as f:
        head = f.read().split("for rep in", 1)[0]
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["FAKE_CHECK"] = srun_output
    if preset is not None:
        env["OPENBLAS_CORETYPE"] = preset
    stub = 'srun() { printf "%s" "$FAKE_CHECK"; }\n'
    out = subprocess.run(["bash", "-c", stub + head + '\necho "coretype=${OPENBLAS_CORETYPE-<unset>}"'],
                         capture_output=True, text=True, env=env)
    check(out.returncode == 0, f"the batch script's head failed: {out.stderr}")
    return out.stdout.strip().splitlines()[-1].split("=", 1)[1]


def blas():
    sys.path.insert(0, HARNESS)
    import scaling
    decide = scaling.blas_coretype_decision
    # The local decision: ndmini's suggestion where it warns and the variable is unset, never over a value
    # already there, nothing without a warning or with keep, the name given otherwise.
    check(decide("auto", GEMM_LINE + WARNING, {})[0] == "Cooperlake", "auto must take the suggested kernel")
    check("ndmini check warns" in decide("auto", GEMM_LINE + WARNING, {})[1], "the reason must say why")
    check(decide("auto", GEMM_LINE, {})[0] is None, "no warning: nothing to set")
    check(decide("auto", "", {})[0] is None, "no check output: nothing to set")
    value, why = decide("auto", GEMM_LINE + WARNING, {"OPENBLAS_CORETYPE": "Haswell"})
    check(value is None and "OPENBLAS_CORETYPE=Haswell from the environment, kept" in why, f"kept? {why}")
    check(decide("SkylakeX", GEMM_LINE + WARNING, {"OPENBLAS_CORETYPE": ""})[0] is None, "an empty value is kept")
    check(decide("keep", GEMM_LINE + WARNING, {})[0] is None, "keep must set nothing")
    check(decide("SkylakeX", GEMM_LINE, {})[0] == "SkylakeX", "a name must be set as given")

    work = tempfile.mkdtemp(prefix="ndmini-blas-")
    try:
        common = ["--ranks", "2", "--layout", "dp", "--no-check"]
        # A bad value is refused before anything is written.
        for bad in ("a;b", "", "Sky lake"):
            out = emit(os.path.join(work, "bad"), "/opt/ndmini/bin/ndmini", common + ["--blas-coretype", bad],
                       expect=2)
            check("argument --blas-coretype" in out.stderr and "give auto, keep, or an OpenBLAS core name" in
                  out.stderr, f"unclear refusal of {bad!r}: {out.stderr}")
            check(not os.path.exists(os.path.join(work, "bad")), "a refused option must write nothing")
        # The batch script decides on the compute node: ndmini check's suggestion when it warns and the
        # job has no OPENBLAS_CORETYPE, before srun; keep and NAME as locally.
        scripts = {}
        for choice in ("auto", "keep", "SkylakeX"):
            d = os.path.join(work, choice)
            emit(d, "/opt/ndmini/bin/ndmini", common + ["--blas-coretype", choice])
            scripts[choice] = os.path.join(d, "points", "n0002_dp_replicate2", "job.sbatch")
        with open(scripts["auto"]) as f:
            text = f.read()
        check('if [[ -z "${OPENBLAS_CORETYPE+set}" ]]; then' in text and
              "srun --ntasks=1 --nodes=1 /opt/ndmini/bin/ndmini check " in text and
              text.index("OPENBLAS_CORETYPE+set") < text.index("for rep in"),
              "auto: the batch script must run ndmini check before the runs when OPENBLAS_CORETYPE is unset")
        check(snippet_coretype(scripts["auto"], GEMM_LINE + WARNING, None) == "Cooperlake",
              "auto: a warning on the node must export its OPENBLAS_CORETYPE")
        check(snippet_coretype(scripts["auto"], GEMM_LINE, None) == "<unset>", "auto: no warning, nothing set")
        check(snippet_coretype(scripts["auto"], GEMM_LINE + WARNING, "Haswell") == "Haswell",
              "auto: the job's own OPENBLAS_CORETYPE must be kept")
        check(snippet_coretype(scripts["keep"], GEMM_LINE + WARNING, None) == "<unset>", "keep must set nothing")
        check(snippet_coretype(scripts["SkylakeX"], GEMM_LINE, None) == "SkylakeX", "NAME must be exported")
        check(snippet_coretype(scripts["SkylakeX"], GEMM_LINE, "Haswell") == "Haswell", "NAME must not override")

        # A local run gets the kernel asked for (ndmini's banner names OpenBLAS's kernel), and the study
        # records it; a value already in the environment (CI's, if any) is kept and recorded instead.
        study_dir = os.path.join(work, "local")
        out = run([sys.executable, SCALING, TINY, "--mode", "weak", "--ranks", "1", "--layout", "dp", "--steps", "3",
                   "--warmup", "1", "--exe", NDMINI, "--launcher", "mpiexec", "--blas-coretype", "Haswell",
                   "--out", study_dir])
        want = os.environ.get("OPENBLAS_CORETYPE", "Haswell")
        with open(os.path.join(study_dir, "study.json")) as f:
            prov = json.load(f)["provenance"]
        check(prov["openblas_coretype"] == want, f"provenance: {prov.get('openblas_coretype')}, expected {want}")
        with open(os.path.join(study_dir, "results.md")) as f:
            check(f"- OpenBLAS kernel: OPENBLAS_CORETYPE={want}" in f.read(), "results.md must name the kernel")
        if "OPENBLAS_CORETYPE" not in os.environ:
            check("scaling.py: OPENBLAS_CORETYPE=Haswell set by the harness" in out.stderr, "the one line is missing")
            with open(os.path.join(study_dir, "points", "n0001_single", "rep1", "stdout.log")) as f:
                banner = f.read()
            if "gemm: OpenBLAS" in banner:
                check("kernel Haswell" in banner, "the run did not get OPENBLAS_CORETYPE=Haswell")
        print("ok: --blas-coretype parsed and refused; decisions on fake check outputs; the batch script's "
              "snippet; a local run with the kernel asked for, recorded")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- Predictions (ndmini plan) ---------------------------------------------------------

CLUSTERS = os.path.join(SOURCE, "inputs", "clusters")
H100 = os.path.join(CLUSTERS, "h100.toml")
HERE = os.path.join(CLUSTERS, "here.toml")


def planner_says(study_dir, cluster, point):
    """`ndmini plan --json` of a point as its run gets it (the study's deck, the point's overrides)."""
    cmd = [NDMINI, "plan", os.path.join(study_dir, "deck.toml"), "--cluster", cluster, "--world", str(point["ranks"]),
           "--json"] + [x for o in point["overrides"] for x in ("--set", o)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    check(out.returncode == 0, f"ndmini plan refused {point['label']}: {out.stderr}")
    return json.loads(out.stdout)["layouts"][0]


def close(got, want, what, tolerance=1e-5):
    """A CSV figure (6 significant digits) against the exact one."""
    check(abs(float(got) - want) <= tolerance * abs(want), f"{what}: {got} in results.csv, expected {want}")


def check_predicted_columns(study_dir, cluster, rows):
    """Every measured row's predicted columns are what ndmini plan --json says of its point."""
    points = {p["label"]: p for p in planned_points(study_dir)}
    measured_rows = [r for r in rows if r["kind"] == "measured"]
    check(measured_rows, "no measured rows")
    for r in measured_rows:
        want = planner_says(study_dir, cluster, points[r["label"]])
        check(r["predicted_status"] == ("fits" if want["fits"] else "does not fit"), f"{r['label']}: status")
        close(r["predicted_step_ms"], want["time_ms"]["step"], f"{r['label']} predicted_step_ms")
        close(r["predicted_tokens_per_s"], want["tokens_per_s"], f"{r['label']} predicted_tokens_per_s")
        close(r["predicted_mfu"], want["mfu"], f"{r['label']} predicted_mfu")
        check(int(r["predicted_memory_bytes"]) == want["memory_bytes"]["total"], f"{r['label']}: memory")
        # Against the measured median (rounded to 6 digits in the CSV, as the error is)
        error = want["time_ms"]["step"] / float(r["step_ms"]) - 1
        check(abs(float(r["predicted_step_error"]) - error) < 1e-4, f"{r['label']}: predicted_step_error "
              f"{r['predicted_step_error']}, expected {error}")
        record = json.loads(read_text(os.path.join(study_dir, "points", r["label"], "plan.json")))
        check(record["ok"] and record["plan"]["layouts"][0] == want, f"{r['label']}: plan.json is not the planner's")


def predicted_table(study_dir):
    """(rows, results.md) of a study."""
    return read_csv(os.path.join(study_dir, "results.csv")), read_text(os.path.join(study_dir, "results.md"))


def predictions():
    work = tempfile.mkdtemp(prefix="ndmini-predict-")
    try:
        common = [TINY, "--steps", "4", "--warmup", "1", "--set", "perf.peak_gflops=100", "--exe", NDMINI,
                  "--launcher", "mpiexec"]
        # Weak, dp, 1 and 2 ranks run here, predicted on here.toml beside them and carried on to 1024 ranks of
        # an H100 cluster: the H100 line starts at the measured rank counts (its own baseline).
        d = os.path.join(work, "weak")
        out = run([sys.executable, SCALING] + common + ["--mode", "weak", "--ranks", "1,2", "--layout", "dp",
                                                        "--cluster", HERE, "--predict-cluster", H100,
                                                        "--predict-to", "1024", "--out", d])
        check("scaling.py: 2 of 2 points measured\n" in out.stderr, "the measured summary must stay as it was")
        check("scaling.py: predicted by ndmini plan: 11 points on h100, 2 points on here\n" in out.stderr,
              f"the prediction summary: {out.stderr}")
        rows, md = predicted_table(d)
        check_predicted_columns(d, HERE, rows)
        check([(r["kind"], r["ranks"]) for r in rows if r["kind"] == "measured"] == [("measured", "1"),
                                                                                    ("measured", "2")], "measured")
        h100 = [r for r in rows if r["kind"] == "predicted"]
        check([int(r["ranks"]) for r in h100] == [2 ** k for k in range(11)], f"ranks {[r['ranks'] for r in h100]}")
        check(all(r["predicted_cluster"] == "h100" and r["status"] == "predicted" and r["predicted_status"] == "fits"
                  for r in h100), "every H100 row must be a fitting prediction")
        for r in h100:  # weak: 8 sequences per data-parallel rank, all ranks data-parallel
            check(int(r["global_batch"]) == 8 * int(r["ranks"]) and r["layout"] == (
                f"dp_replicate={r['ranks']}" if r["ranks"] != "1" else "single"), f"{r['label']}: batch or layout")
            check(r["tokens_per_s"] == "" and r["step_ms"] == "", f"{r['label']}: a predicted row measured nothing")
            check(r["nodes"] == str(max(1, int(r["ranks"]) // 8)), f"{r['label']}: {r['nodes']} H100 nodes")
            # tokens/s is the global batch's tokens over the step (tiny: 64 tokens a sequence)
            close(r["predicted_tokens_per_s"], int(r["global_batch"]) * 64 / float(r["predicted_step_ms"]) * 1e3,
                  f"{r['label']}: tokens/s", tolerance=3e-5)  # two rounded figures
            want = planner_says(d, H100, next(p for p in json.loads(read_text(os.path.join(d, "study.json")))[
                "predicted_points"] if p["label"] == r["label"]))
            close(r["predicted_step_ms"], want["time_ms"]["step"], f"{r['label']} (h100) predicted_step_ms")
        # Weak scaling on a network: the step never gets shorter, the efficiency never higher, and it starts at 1.
        steps = [float(r["predicted_step_ms"]) for r in h100]
        effs = [float(r["predicted_efficiency"]) for r in h100]
        check(all(a <= b for a, b in zip(steps, steps[1:])), f"weak: predicted step times must not fall: {steps}")
        check(effs[0] == 1 and all(a >= b for a, b in zip(effs, effs[1:])) and effs[-1] > 0,
              f"weak: predicted efficiencies must fall from 1: {effs}")
        check(steps[4] > steps[3], "16 ranks cross the node (8 per node): the step must grow")
        for want in ("| 1024 | dp_replicate=1024 | 8192 / 4 | predicted (h100) |",
                     "- beside every measured point: here = this machine",
                     "- rows marked predicted (h100): the layout rule dp carried on to every measured rank count and "
                     "the powers of two up to 1024 ranks", "| MFU: measured / predicted |"):
            check(want in md, f"results.md lacks '{want}'")
        check(os.path.exists(os.path.join(d, "clusters", "h100.toml")) and
              os.path.exists(os.path.join(d, "predicted", "h100", "n1024_dp_replicate1024", "plan.json")),
              "the cluster files and every prediction are kept in the study")
        check(os.path.exists(os.path.join(d, "scaling.png")) == has_matplotlib(), "scaling.png")

        # The collector works from the study directory alone (no binary), and gives the same table.
        study = json.loads(read_text(os.path.join(d, "study.json")))
        study["exe"] = os.path.join(work, "no-such-ndmini")
        with open(os.path.join(d, "study.json"), "w") as f:
            json.dump(study, f)
        run([sys.executable, os.path.join(HARNESS, "collect.py"), d])
        check(predicted_table(d) == (rows, md), "collect.py rebuilt a different table offline")
        # collect.py --cluster predicts again (here: the same cluster carried on to 8 ranks), with --exe.
        run([sys.executable, os.path.join(HARNESS, "collect.py"), d, "--cluster", H100, "--predict-to", "8", "--exe",
             NDMINI])
        rows, md = predicted_table(d)
        check([(r["kind"], r["ranks"]) for r in rows] == [("measured", "1"), ("measured", "2"), ("predicted", "4"),
                                                          ("predicted", "8")], "collect.py --cluster h100 to 8")
        check_predicted_columns(d, H100, rows)
        check(not os.path.exists(os.path.join(d, "predicted", "h100", "n1024_dp_replicate1024")),
              "the earlier extension must be replaced")

        # Strong: the global batch (8) kept; past 8 data-parallel ranks the batch rule refuses, shown as refused.
        # A cluster whose devices are too small: every prediction is there, marked 'does not fit'.
        small = os.path.join(work, "small-h100.toml")
        with open(H100) as f:
            text = f.read()
        with open(small, "w") as f:
            f.write(re.sub(r"memory_gib = \d+", "memory_gib = 0.001", text))
        d = os.path.join(work, "strong")
        run([sys.executable, SCALING] + common + ["--mode", "strong", "--ranks", "1", "--layout", "fsdp", "--cluster",
                                                  H100, "--predict-to", "64", "--out", d])
        rows, md = predicted_table(d)
        check([int(r["ranks"]) for r in rows] == [1, 2, 4, 8, 16, 32, 64], f"ranks {[r['ranks'] for r in rows]}")
        check(all(r["global_batch"] == "8" for r in rows), "strong: the global batch is kept")
        check([r["status"] for r in rows[1:]] == ["predicted"] * 3 + ["refused"] * 3, "8 sequences: 8 ranks at most")
        check("which 16 data-parallel ranks (dp_replicate x dp_shard) cannot share" in rows[4]["message"],
              f"the refusal must say why: {rows[4]['message']}")
        check("| 16 | dp_shard=16 | 8 / 4 | predicted (h100) | | | | | | refused: strong scaling keeps" in md,
              "results.md must show the refused prediction")
        run([sys.executable, os.path.join(HARNESS, "collect.py"), d, "--cluster", small, "--predict-to", "2"])
        rows, md = predicted_table(d)
        check([r["predicted_status"] for r in rows] == ["does not fit"] * 2, "a 1 MiB device fits nothing")
        check("above device.memory_gib = 0.001" in rows[1]["message"], f"message {rows[1]['message']}")
        check("| predicted (small-h100) | | | | | | does not fit: " in md, "results.md must say it does not fit")

        # A --point study is predicted point by point; a point the planner refuses is shown with its message.
        d = os.path.join(work, "points")
        run([sys.executable, SCALING] + common + ["--mode", "strong", "--point", "1:tp=1", "--point", "3:tp=3",
                                                  "--cluster", H100, "--out", d], expect=1)
        rows, md = predicted_table(d)
        check([r["predicted_status"] for r in rows] == ["fits", "refused"], "tp=3 on 4 heads: refused")
        check("parallel.tp" in rows[1]["predicted_message"], f"the planner's reason: {rows[1]['predicted_message']}")
        check("| 3 | tp=3 | 8 / 4 | refused |" in md and "| refused: " in md, "results.md: the refused prediction")

        # Bad combinations: one message, exit 2, nothing written.
        bad = os.path.join(work, "bad")
        broken = os.path.join(work, "broken.toml")
        with open(broken, "w") as f:
            f.write(text.replace("memory_bandwidth_gbs", "# memory_bandwidth_gbs"))
        for extra, message in (
                (["--ranks", "1", "--layout", "dp", "--predict-to", "8"], "--predict-to needs --cluster FILE"),
                (["--ranks", "1", "--layout", "dp", "--cluster", os.path.join(work, "nope.toml")],
                 "no such file; give a cluster file such as inputs/clusters/here.toml"),
                (["--ranks", "1", "--layout", "dp", "--cluster", HERE, "--predict-cluster", H100],
                 "--predict-cluster FILE is the cluster of the --predict-to extension"),
                (["--point", "1:tp=1", "--cluster", H100, "--predict-to", "8"],
                 "a study of --point layouts has no rule"),
                (["--ranks", "1,2", "--layout", "dp", "--cluster", H100, "--predict-to", "3"],
                 "--predict-to 3: no power of two above the study's largest rank count 2"),
                (["--ranks", "1", "--layout", "dp", "--cluster", broken],
                 f"cluster file '{broken}': missing key device.memory_bandwidth_gbs")):
            out = run([sys.executable, SCALING] + common + ["--mode", "weak", "--out", bad] + extra, expect=2)
            errors = [line for line in out.stderr.splitlines() if "error" in line]
            check(len(errors) == 1 and message in errors[0], f"expected one message with '{message}': {out.stderr}")
            check(not os.path.exists(bad), "a refused study must write nothing")
        out = run([sys.executable, os.path.join(HARNESS, "collect.py"), d, "--predict-to", "8"], expect=2)
        check("collect.py: error: --predict-to needs --cluster FILE" in out.stderr, f"collect.py: {out.stderr}")
        print("ok: predictions equal ndmini plan's beside every point, carried on to 1024 H100s (weak: monotone), "
              "refused and non-fitting predictions shown, offline collection, bad combinations refused")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# A refusal is a stat() and a message: seconds even on a loaded machine, where a
# FIFO opened for reading would wait for its writer forever.
BAD_PATH_BOUND_S = 30


def bad_paths():
    work = tempfile.mkdtemp(prefix="ndmini-bad-paths-")
    try:
        fifo = os.path.join(work, "fifo")
        os.mkfifo(fifo)
        a_file = os.path.join(work, "a_file")
        with open(a_file, "w") as f:
            f.write("not a study\n")
        huge = os.path.join(work, "huge.toml")
        with open(huge, "w") as f:
            f.write("# padding\n" * 120000)  # 1.2 MB, over ndmini's 1 MiB deck bound
        here = os.path.join(SOURCE, "inputs", "clusters", "here.toml")
        out_dir = os.path.join(work, "study")
        rule = ["--mode", "weak", "--ranks", "1", "--layout", "dp", "--exe", NDMINI, "--launcher", "mpiexec"]
        cases = (
            ([fifo] + rule + ["--out", out_dir], f"deck {fifo}: a FIFO, not a regular file"),
            ([huge] + rule + ["--out", out_dir], f"deck {huge}: 1200000 bytes, more than the 1048576 ndmini reads"),
            ([TINY] + rule + ["--out", a_file], f"--out {a_file}: exists and is a file, not a directory"),
            ([TINY] + rule + ["--out", fifo], f"--out {fifo}: exists and is a FIFO, not a directory"),
            ([TINY] + rule + ["--emit-sbatch", a_file], f"--emit-sbatch {a_file}: exists and is a file"),
            ([TINY] + rule + ["--out", out_dir, "--cluster", fifo], f"--cluster {fifo}: a FIFO, not a regular file"),
            ([TINY] + rule + ["--out", out_dir, "--cluster", here, "--predict-to", "8", "--predict-cluster", fifo],
             f"--predict-cluster {fifo}: a FIFO, not a regular file"),
            ([TINY] + rule + ["--out", out_dir, "--cluster", here, "--predict-to", "1000000000000"],
             "--predict-to 1000000000000: give the largest rank count to predict, from 2 to 1048576"),
            ([TINY] + rule + ["--out", out_dir, "--cluster", here, "--predict-to", "1048577"],
             "--predict-to 1048577: give the largest rank count to predict, from 2 to 1048576"),
        )
        for extra, message in cases:
            cmd = [sys.executable, SCALING] + extra
            print("$ " + " ".join(cmd), flush=True)
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=BAD_PATH_BOUND_S)
            except subprocess.TimeoutExpired:
                fail(f"no answer within {BAD_PATH_BOUND_S} s: {' '.join(cmd)}")
            sys.stderr.write(out.stderr)
            check(out.returncode == 2, f"exit {out.returncode}, expected 2")
            lines = out.stderr.splitlines()
            check(len(lines) == 1 and lines[0].startswith("scaling.py: error: ") and message in lines[0],
                  f"expected one 'scaling.py: error:' line with '{message}': {out.stderr!r}")
            check(not os.path.exists(out_dir), "a refused study must write nothing")
        with open(a_file) as f:
            check(f.read() == "not a study\n", "the file --out named was changed")
        out = subprocess.run([sys.executable, os.path.join(HARNESS, "collect.py"), work, "--cluster", fifo],
                             capture_output=True, text=True, timeout=BAD_PATH_BOUND_S)
        check(out.returncode == 2 and "collect.py: error:" in out.stderr, f"collect.py --cluster FIFO: {out.stderr!r}")
        print(f"ok: {len(cases) + 1} bad paths refused, each with one message and exit 2, nothing written")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    cases = {"smoke": smoke, "batch": batch, "sbatch": sbatch, "slurm-run": slurm_run, "blas": blas,
             "predict": predictions, "bad-paths": bad_paths,
             "examples-help": examples_help, "examples-readme": examples_readme}
    if len(sys.argv) != 2 or sys.argv[1] not in cases:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(cases)}")
    cases[sys.argv[1]]()
