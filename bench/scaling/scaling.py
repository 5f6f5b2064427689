#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Strong and weak scaling studies of ndmini, from one command.

Runs `ndmini train DECK --metrics` at each point (a rank count and a mesh
layout), drops warm-up steps, repeats, and writes results.csv, results.md and
scaling.png (with matplotlib) into the study directory. Locally the points
run under mpiexec; inside a Slurm allocation under srun; with --emit-sbatch
nothing runs: one batch script per point is written, with submit_all.sh and
collect.sh (which builds the table once the jobs are done).

  # weak scaling of pure data parallelism on 1, 2 and 4 ranks
  bench/scaling/scaling.py inputs/small.toml --mode weak --ranks 1,2,4 --layout dp --out runs/dp-weak
  # strong scaling with tp=2 and the rest FSDP, 3 runs per point
  bench/scaling/scaling.py inputs/small.toml --mode strong --ranks 2,4,8 --layout tp=2,rest=dp_shard --repeats 3
  # explicit degrees per point
  bench/scaling/scaling.py inputs/small.toml --mode weak --point 1:tp=1 --point 2:dp_shard=2 --point 4:dp_shard=2,tp=2
  # a cluster: one batch script per point, 4 ranks and 4 GPUs per node
  bench/scaling/scaling.py inputs/gpt2-124m.toml --mode weak --ranks 4,8,16,32 --layout fsdp \\
      --ranks-per-node 4 --gpus-per-task 1 --emit-sbatch runs/fsdp-weak --partition gpu --time 00:30:00
  runs/fsdp-weak/submit_all.sh ; (later) runs/fsdp-weak/collect.sh

Layouts (--layout): dp (all ranks on dp_replicate), fsdp (all on dp_shard), or
fixed degrees AXIS=D,... with the rest of the ranks on dp_replicate or on the
axis named by rest=AXIS (tp=2; pp=2,tp=2; tp=2,rest=dp_shard).

Batches: the data-parallel degree of a mesh is dp_replicate x dp_shard, and the
deck's per-rank batch is its train.global_batch over its own data-parallel
degree (the deck's parallel.dp_replicate x dp_shard as written, after --set;
1 where unset). Weak scaling keeps that per-rank batch: each point's global
batch is it times the point's data-parallel degree (tp, cp and pp ranks share
their data-parallel rank's sequences). Strong scaling keeps the deck's global
batch. Either way each point's micro-batch is the largest divisor of its
per-rank batch not above the deck's train.micro_batch, or --micro-batch N.

A point that cannot run (a batch its data-parallel ranks cannot share, or a
layout `ndmini check` refuses) is refused before anything runs; the others run
(or are emitted) and the table lists the refused ones with the reason. The
study then exits 1, unless --allow-missing is given.

Predictions (--cluster FILE): every point is also planned with `ndmini plan
--cluster FILE --world N --json` and its own --set overrides (kept as
points/<label>/plan.json); the table and figure give the predicted step time,
tokens/s, efficiency and MFU beside the measured ones. For runs on this machine
use inputs/clusters/here.toml (or `mpiexec -n 2 ndmini plan --calibrate --out
FILE`). --predict-to N carries the --layout rule on to the powers of two up to N
ranks, predicted only (rows marked predicted), on --predict-cluster FILE
(default: --cluster's), e.g. --cluster inputs/clusters/here.toml
--predict-cluster inputs/clusters/h100.toml --predict-to 1024.

Batch scripts ask Slurm for SIGUSR1 --signal-grace seconds before the time
limit (ndmini saves a checkpoint at the next step boundary and stops); submit
the point's job.sbatch again and the run resumes from its checkpoint's latest
(repeats that finished are not run again).

OpenBLAS's kernel (--blas-coretype, default auto): an OpenBLAS older than the
CPU model runs a generic kernel several times slower, and `ndmini check` warns
with the fix (export OPENBLAS_CORETYPE=NAME). With auto, where ndmini warns on
the machine the points run on and OPENBLAS_CORETYPE is unset, the points run
with the suggested kernel and the provenance says so; batch scripts decide on
the compute node, before srun. keep leaves OpenBLAS to pick; NAME exports
OPENBLAS_CORETYPE=NAME. A value already in the environment is never changed.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import predict  # noqa: E402
import study as st  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_WARMUP = 2
DEFAULT_TIME = "00:30:00"
DEFAULT_SIGNAL_GRACE = 120
# ndmini's warning when OpenBLAS runs a kernel below the CPU's names the fix
# as "Fix: export OPENBLAS_CORETYPE=NAME" (kernels/gemm_library.cpp).
CORETYPE_FIX = re.compile(r"Fix: export OPENBLAS_CORETYPE=([A-Za-z0-9_]+)")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("deck", help="input deck (TOML), e.g. inputs/small.toml")
    p.add_argument("--mode", choices=("weak", "strong"), required=True,
                   help="weak: fixed batch per data-parallel rank (the global batch grows with dp_replicate x "
                        "dp_shard); strong: fixed global batch")
    p.add_argument("--ranks", help="rank counts, e.g. 1,2,4,8 (with --layout)")
    p.add_argument("--layout", help="layout rule: dp, fsdp, or AXIS=D,...[,rest=AXIS] (see above)")
    p.add_argument("--point", action="append", default=[], metavar="N:AXIS=D,...",
                   help="an explicit point, repeatable (instead of --ranks/--layout): 4:tp=2,dp_shard=2")
    p.add_argument("--steps", type=int, help="steps per run (default: the deck's train.steps)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="leading steps dropped from each run")
    p.add_argument("--repeats", type=int, default=1, help="runs per point (median and min-max over them)")
    p.add_argument("--global-batch", type=int,
                   help="the global batch taken as the deck's (default: train.global_batch); weak scaling divides "
                        "it by the deck's data-parallel degree")
    p.add_argument("--micro-batch", type=int,
                   help="micro-batch of every point (default: per point, the largest divisor of its per-rank batch "
                        "not above the deck's train.micro_batch)")
    p.add_argument("--allow-missing", action="store_true",
                   help="exit 0 even when points are refused (they are listed in the table with the reason)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", dest="overrides",
                   help="deck override passed to every run (repeatable)")
    p.add_argument("--out", help="study directory (default: runs/<name>)")
    p.add_argument("--name", help="study name (default: <deck>-<mode>-<layout>)")
    p.add_argument("--exe", default=os.environ.get("NDMINI_EXE", os.path.join(REPO, "build", "miniapp", "ndmini")),
                   help="the ndmini executable (default: $NDMINI_EXE or build/miniapp/ndmini)")
    p.add_argument("--launcher", choices=("auto", "mpiexec", "srun"), default="auto",
                   help="auto: srun inside a Slurm allocation (SLURM_JOB_ID set), mpiexec otherwise")
    p.add_argument("--launcher-args", default="",
                   help="extra arguments for the launcher, one string (binding: --cpu-bind, not here)")
    p.add_argument("--ranks-per-node", type=int, help="placement (default: $SLURM_NTASKS_PER_NODE, else all on one)")
    p.add_argument("--gpus-per-task", type=int, default=0, help="GPUs per rank (srun and batch scripts)")
    p.add_argument("--cpus-per-task", type=int, help="cores per rank (srun and batch scripts)")
    p.add_argument("--cpu-bind", default="cores",
                   help="binding of each rank: srun --cpu-bind=VALUE; under mpiexec cores, threads or sockets "
                        "become --bind-to core, hwthread or socket, and none binds nothing (default cores)")
    p.add_argument("--timeout", type=float, help="seconds a run may take before it is killed and marked failed")
    p.add_argument("--no-check", action="store_true",
                   help="skip `ndmini check --world N` of each point before running or emitting")
    g = p.add_argument_group("predictions (ndmini plan; docs/planner.md)")
    g.add_argument("--cluster", metavar="FILE",
                   help="predict every point with `ndmini plan` on this cluster file, beside the measured figures "
                        "(for runs on this machine: inputs/clusters/here.toml, or a file written by `mpiexec -n 2 "
                        "ndmini plan --calibrate --out FILE`)")
    g.add_argument("--predict-to", type=int, metavar="N",
                   help="carry the --layout rule on to the powers of two up to N ranks, predicted only (nothing "
                        "runs): strong keeps the global batch, weak the batch per data-parallel rank; needs --cluster")
    g.add_argument("--predict-cluster", metavar="FILE",
                   help="the cluster of the --predict-to rows (default: --cluster's), e.g. "
                        "inputs/clusters/h100.toml beside --cluster inputs/clusters/here.toml")
    g = p.add_argument_group("batch scripts")
    g.add_argument("--emit-sbatch", metavar="DIR", help="write batch scripts into DIR (the study directory) and stop")
    g.add_argument("--partition", help="#SBATCH --partition")
    g.add_argument("--account", help="#SBATCH --account")
    g.add_argument("--time", default=DEFAULT_TIME, help=f"#SBATCH --time per point (default {DEFAULT_TIME})")
    g.add_argument("--sbatch-line", action="append", default=[], help="extra '#SBATCH ...' option, repeatable")
    g.add_argument("--signal-grace", type=int, default=DEFAULT_SIGNAL_GRACE, metavar="SECONDS",
                   help=f"#SBATCH --signal=USR1@SECONDS: ndmini saves a checkpoint and stops that long before the "
                        f"time limit (default {DEFAULT_SIGNAL_GRACE}; 0: no signal)")
    p.add_argument("--blas-coretype", type=blas_coretype_option, default="auto", metavar="auto|keep|NAME",
                   help="OpenBLAS's kernel: auto (default) exports the OPENBLAS_CORETYPE ndmini's check suggests "
                        "when OpenBLAS runs a kernel below this CPU's; keep leaves it to OpenBLAS; NAME (e.g. "
                        "SkylakeX) exports that one. A value already in the environment is kept")
    return p.parse_args(argv)


def blas_coretype_option(value):
    """--blas-coretype: auto, keep, or an OpenBLAS core name (letters, digits, _)."""
    if value in ("auto", "keep") or re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", value):
        return value
    raise argparse.ArgumentTypeError(f"'{value}': give auto, keep, or an OpenBLAS core name such as SkylakeX")


def blas_coretype_decision(choice, check_output, env):
    """(OPENBLAS_CORETYPE to export or None, why): --blas-coretype's choice, the
    output of `ndmini check` on the machine, and the environment the runs inherit."""
    if "OPENBLAS_CORETYPE" in env:
        return None, f"OPENBLAS_CORETYPE={env['OPENBLAS_CORETYPE']} from the environment, kept"
    if choice == "keep":
        return None, "--blas-coretype keep: OpenBLAS picks its kernel itself"
    if choice != "auto":
        return choice, f"OPENBLAS_CORETYPE={choice} set by the harness (--blas-coretype {choice})"
    fix = CORETYPE_FIX.search(check_output or "")
    if fix:
        return fix.group(1), (f"OPENBLAS_CORETYPE={fix.group(1)} set by the harness: ndmini check warns that "
                              f"OpenBLAS runs a kernel below this CPU's")
    return None, "OpenBLAS's own kernel choice (ndmini check gave no warning about it)"


def machine_check_output(exe, deck, points):
    """`ndmini check`'s output on this machine for the first point it may run
    (its gemm lines and any warning), '' where it cannot run."""
    for p in points:
        if not p.get("precheck_error"):
            cmd = [exe, "check", deck, "--world", str(p["ranks"])]
            for o in p["overrides"]:
                cmd += ["--set", o]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                return ""
            return out.stdout + out.stderr
    return ""


def plan_points(args):
    """[(ranks, degrees)] from --ranks/--layout or --point."""
    if args.point:
        if args.ranks or args.layout:
            raise st.StudyError("give either --point (repeatable) or --ranks with --layout, not both")
        return [st.explicit_point(p) for p in args.point]
    if not (args.ranks and args.layout):
        raise st.StudyError("give --ranks (e.g. 1,2,4) and --layout (dp, fsdp, tp=2, ...), or --point")
    try:
        ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    except ValueError:
        raise st.StudyError(f"--ranks {args.ranks}: expected comma-separated integers, e.g. 1,2,4") from None
    if not ranks or min(ranks) < 1:
        raise st.StudyError(f"--ranks {args.ranks}: rank counts must be at least 1")
    return [(n, st.layout_degrees(args.layout, n)) for n in sorted(set(ranks))]


def detect_launcher(choice):
    if choice != "auto":
        return choice
    return "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "mpiexec"


# --cpu-bind values as MPICH's and Open MPI's mpiexec spell them (--bind-to).
MPIEXEC_BIND = {"cores": "core", "threads": "hwthread", "sockets": "socket", "none": None}


def mpiexec_binding(cpu_bind):
    """mpiexec's options for --cpu-bind. Bound by default, as under srun, so
    that each rank keeps one core (and its cache) for the whole run."""
    if cpu_bind not in MPIEXEC_BIND:
        raise st.StudyError(f"--cpu-bind {cpu_bind}: under mpiexec give one of {', '.join(MPIEXEC_BIND)}")
    return ["--bind-to", MPIEXEC_BIND[cpu_bind]] if MPIEXEC_BIND[cpu_bind] else []


def launch_prefix(launcher, point, args):
    """The launcher part of a run's command line."""
    extra = args.launcher_args.split() if args.launcher_args else []
    if launcher == "mpiexec":
        return ["mpiexec", "-n", str(point["ranks"])] + mpiexec_binding(args.cpu_bind) + extra
    cmd = ["srun", f"--ntasks={point['ranks']}", f"--nodes={point['nodes']}",
           f"--ntasks-per-node={point['tasks_per_node']}"]
    if point["gpus_per_task"]:
        cmd.append(f"--gpus-per-task={point['gpus_per_task']}")
    if args.cpus_per_task:
        cmd.append(f"--cpus-per-task={args.cpus_per_task}")
    cmd.append(f"--cpu-bind={args.cpu_bind}")
    return cmd + extra


def train_args(exe, deck, overrides, metrics):
    args = [exe, "train", deck]
    for o in overrides:
        args += ["--set", o]
    return args + ["--metrics", metrics]


def check_point(exe, deck, overrides, ranks):
    """`ndmini check --world N`: ndmini's message when it refuses the point, else ''.

    Only ndmini's own refusal counts: where the check cannot run at all (a
    login node whose MPI will not start outside the launcher), the point is
    left to its run, and a warning says so.
    """
    cmd = [exe, "check", deck, "--world", str(ranks)]
    for o in overrides:
        cmd += ["--set", o]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"scaling.py: warning: could not run '{exe} check' ({e}); points are not checked", file=sys.stderr)
        return ""
    if out.returncode == 0:
        return ""
    refusals = [line.strip() for line in (out.stderr + out.stdout).splitlines() if "ndmini: error:" in line]
    if refusals:  # the message alone: record_failure adds the prefix again
        return refusals[-1].split("ndmini: error:", 1)[1].strip()
    print(f"scaling.py: warning: '{exe} check' exited {out.returncode} without a message from ndmini; "
          f"points are not checked", file=sys.stderr)
    return ""


def deck_batch_per_rank(deck_batch, deck_int):
    """The deck's global batch over its own data-parallel degree (dp_replicate x dp_shard
    as written, 1 where unset): the sequences each data-parallel rank trains per step."""
    degrees = {a: deck_int("parallel", a) for a in ("dp_replicate", "dp_shard")}
    for axis, d in degrees.items():
        if d is not None and d < 1:
            raise st.StudyError(f"weak scaling keeps the deck's batch per data-parallel rank, but the deck sets "
                                f"parallel.{axis} = {d} (what is left of the world), so that batch depends on the "
                                f"world; give the degree the deck is sized for: --set parallel.{axis}=N")
    dp = (degrees["dp_replicate"] or 1) * (degrees["dp_shard"] or 1)
    if deck_batch % dp:
        raise st.StudyError(f"weak scaling: the deck's global batch {deck_batch} is not a multiple of its "
                            f"data-parallel degree {dp} (parallel.dp_replicate x dp_shard), so it has no batch per "
                            f"data-parallel rank; fix the deck or give --global-batch")
    return deck_batch // dp


def build_study(args):
    deck_path = os.path.abspath(args.deck)
    with open(deck_path) as f:
        deck_text = f.read()
    points = plan_points(args)
    deck_name = os.path.splitext(os.path.basename(deck_path))[0]
    layout_name = args.layout.replace("=", "").replace(",", "-") if args.layout else "explicit"
    name = args.name or f"{deck_name}-{args.mode}-{layout_name}"
    study_dir = os.path.abspath(args.emit_sbatch or args.out or os.path.join("runs", name))
    launcher = "srun" if args.emit_sbatch else detect_launcher(args.launcher)
    if launcher == "mpiexec":
        mpiexec_binding(args.cpu_bind)  # refuse a binding mpiexec cannot take before anything runs

    def deck_int(section, key):
        v = st.overridden(args.overrides, section, key)
        v = v if v is not None else st.deck_value(deck_text, section, key)
        return int(v) if v is not None else None

    deck_batch = args.global_batch or deck_int("train", "global_batch") or 8  # ndmini's defaults
    deck_micro = deck_int("train", "micro_batch") or 4
    batch_per_rank = deck_batch_per_rank(deck_batch, deck_int) if args.mode == "weak" else None
    seq_len = deck_int("model", "seq_len")
    steps = args.steps or deck_int("train", "steps") or 20
    if steps <= args.warmup:
        raise st.StudyError(f"--steps {steps} leaves nothing after --warmup {args.warmup}; raise --steps")
    rpn_default = args.ranks_per_node or int(os.environ.get("SLURM_NTASKS_PER_NODE", "0").split("(")[0] or 0) or None

    sha, dirty = st.git_state(REPO)
    provenance = {"deck_sha256": st.sha256_file(deck_path), "deck_path": deck_path,
                  "source_git_sha": sha + ("-dirty" if dirty else ""), **st.environment_provenance()}
    study = {"name": name, "mode": args.mode, "deck_name": deck_name, "deck": os.path.join(study_dir, "deck.toml"),
             "overrides": args.overrides, "steps": steps, "warmup": args.warmup, "repeats": args.repeats,
             "seq_len": seq_len, "exe": os.path.abspath(args.exe), "launcher": launcher,
             "layout_rule": args.layout or "explicit", "batch_per_rank": batch_per_rank,
             "global_batch": deck_batch if args.mode == "strong" else None, "micro_batch_fixed": args.micro_batch,
             "deck_micro_batch": deck_micro, "allow_missing": args.allow_missing, "points": [],
             "provenance": provenance}
    study["points"] = [st.make_point(study, ranks, degrees, os.path.join(study_dir, "points"), rpn_default,
                                     args.gpus_per_task) for ranks, degrees in points]
    labels = [p["label"] for p in study["points"]]
    if len(set(labels)) != len(labels):
        raise st.StudyError("two points have the same rank count and layout; give each point once")
    return study, study_dir, deck_path


def write_plan(study, study_dir, deck_path):
    os.makedirs(study_dir, exist_ok=True)
    shutil.copyfile(deck_path, study["deck"])
    for p in study["points"]:
        os.makedirs(p["dir"], exist_ok=True)
        with open(os.path.join(p["dir"], "point.json"), "w") as f:
            json.dump(p, f, indent=2)
    st.save_study(study, study_dir)


def precheck(study, args):
    """Marks points that ndmini refuses (layout, batch) as refused before any run."""
    if args.no_check:
        return
    if not os.path.exists(study["exe"]):
        raise st.StudyError(f"{study['exe']}: no ndmini executable; build it, pass --exe, or --no-check")
    for p in study["points"]:
        if p.get("precheck_error"):  # the harness refused it already
            continue
        message = check_point(study["exe"], study["deck"], p["overrides"], p["ranks"])
        if message:
            p["precheck_error"] = message


def record_failure(run_dir, message):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "stderr.log"), "a") as f:
        f.write(f"ndmini: error: {message}\n")
    with open(os.path.join(run_dir, "exit_code"), "w") as f:
        f.write("1\n")


def run_points(study, args):
    launcher = study["launcher"]
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core per rank, as the MFU peak assumes
    info = st.build_info(study["exe"], ["mpiexec", "-n", "1"] if launcher == "mpiexec" else ["srun", "-n", "1"])
    study["provenance"]["build_info"] = info
    coretype, why = blas_coretype_decision(args.blas_coretype, machine_check_output(
        study["exe"], study["deck"], study["points"]) if args.blas_coretype == "auto" else "", env)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
        print(f"scaling.py: {why}; every point runs with it", file=sys.stderr, flush=True)
    study["provenance"]["openblas_coretype"] = env.get("OPENBLAS_CORETYPE", "")
    study["provenance"]["openblas_coretype_note"] = why
    hosts = os.environ.get("SLURM_JOB_NODELIST", "") if launcher == "srun" else st.socket.gethostname()
    # Repeats go round the points (run 1 of every point, then run 2, ...), so a
    # machine that drifts over minutes shifts every point alike, not one.
    for k in range(1, study["repeats"] + 1):
        for p in study["points"]:
            run_dir = os.path.join(p["dir"], f"rep{k}")
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, "hosts"), "w") as f:
                f.write(hosts + "\n")
            with open(os.path.join(run_dir, "build_info.json"), "w") as f:
                json.dump(info, f)
            if os.environ.get("SLURM_JOB_ID"):
                with open(os.path.join(run_dir, "slurm_job_id"), "w") as f:
                    f.write(os.environ["SLURM_JOB_ID"] + "\n")
            if p.get("precheck_error"):
                record_failure(run_dir, p["precheck_error"])
                continue
            cmd = launch_prefix(launcher, p, args) + train_args(study["exe"], study["deck"], p["overrides"] + [
                f"checkpoint.dir={os.path.join(run_dir, 'ckpt')}"], os.path.join(run_dir, "metrics.jsonl"))
            with open(os.path.join(run_dir, "command.txt"), "w") as f:
                f.write(st.quote(cmd) + "\n")
            print(f"[{p['label']} run {k}/{study['repeats']}] {p['ranks']} ranks, "
                  f"{st.short_layout(p['degrees'])}, global batch {p['global_batch']}, micro-batch {p['micro_batch']}",
                  file=sys.stderr, flush=True)
            t0 = time.time()
            with open(os.path.join(run_dir, "stdout.log"), "w") as out, \
                    open(os.path.join(run_dir, "stderr.log"), "w") as err:
                try:
                    code = subprocess.run(cmd, stdout=out, stderr=err, env=env, timeout=args.timeout).returncode
                except subprocess.TimeoutExpired:
                    err.write(f"ndmini: error: the run took more than --timeout {args.timeout:g} s and was killed\n")
                    code = 124
                except OSError as e:
                    err.write(f"ndmini: error: could not launch {cmd[0]}: {e}\n")
                    code = 127
            with open(os.path.join(run_dir, "exit_code"), "w") as f:
                f.write(f"{code}\n")
            print(f"    exit {code} after {time.time() - t0:.0f} s", file=sys.stderr, flush=True)


# --- Batch scripts -----------------------------------------------------------------


def sbatch_script(study, p, args):
    q = st.quote
    lines = ["#!/bin/bash",
             f"# ndmini scaling study {study['name']}: point {p['label']} ({p['ranks']} ranks, "
             f"{st.mesh_text(p['degrees'])}, global batch {p['global_batch']}), {study['repeats']} run(s).",
             "# Written by bench/scaling/scaling.py --emit-sbatch: submit_all.sh submits every point, "
             "collect.sh builds the table.",
             f"#SBATCH --job-name=ndmini-{study['name']}-{p['label']}",
             f"#SBATCH --nodes={p['nodes']}",
             f"#SBATCH --ntasks={p['ranks']}",
             f"#SBATCH --ntasks-per-node={p['tasks_per_node']}"]
    if p["gpus_per_task"]:
        lines.append(f"#SBATCH --gpus-per-task={p['gpus_per_task']}")
    if args.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={args.cpus_per_task}")
    lines.append(f"#SBATCH --time={args.time}")
    if args.signal_grace:  # to the job steps (ndmini), not the batch shell: ndmini saves and stops
        lines.append(f"#SBATCH --signal=USR1@{args.signal_grace}")
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    lines.append(f"#SBATCH --output={os.path.join(p['dir'], 'slurm-%j.out')}")
    lines += [f"#SBATCH {extra}" for extra in args.sbatch_line]
    srun = launch_prefix("srun", p, args)
    lines += ["set -uo pipefail",
              f"point={q([p['dir']])}",
              "export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}",
              *blas_coretype_lines(study, p, args),
              f"for rep in {' '.join(str(k) for k in range(1, study['repeats'] + 1))}; do",
              '  run="$point/rep$rep"',
              '  [[ "$(cat "$run/exit_code" 2>/dev/null)" == 0 ]] && continue  # finished in an earlier job',
              "  resume=",
              '  if [[ -e "$run/ckpt/latest" ]]; then',
              "    # Stopped by an earlier job with a checkpoint (SIGUSR1 before its time limit): that job's",
              "    # files move aside, the run resumes from the checkpoint named by 'latest'.",
              "    resume=--resume",
              '    before="$run/interrupted-$(cat "$run/slurm_job_id" 2>/dev/null || echo unknown)"',
              '    mkdir -p "$before"',
              '    for f in stdout.log stderr.log metrics.jsonl exit_code; do',
              '      if [[ -e "$run/$f" ]]; then mv "$run/$f" "$before/"; fi',
              "    done",
              "  fi",
              '  mkdir -p "$run"',
              '  echo "$SLURM_JOB_ID" > "$run/slurm_job_id"',
              '  scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd" " > "$run/hosts"',
              f"  srun --ntasks=1 --nodes=1 {q([study['exe']])} --build-info > \"$run/build_info.json\" || true",
              "  " + q(srun + train_args(study["exe"], study["deck"], p["overrides"], "")[:-1]) +
              ' "$run/metrics.jsonl" --set "checkpoint.dir=$run/ckpt" $resume > "$run/stdout.log" 2> "$run/stderr.log"',
              "  code=$?",
              '  echo $code > "$run/exit_code"',
              '  if [[ $code -ne 0 && -e "$run/ckpt/latest" ]]; then  # stopped with a checkpoint: the job is ending',
              '    echo "rep$rep stopped at a checkpoint (exit $code); submit $point/job.sbatch again to resume" >&2',
              "    exit $code",
              "  fi",
              "done",
              ""]
    return "\n".join(lines)


def blas_coretype_lines(study, p, args):
    """The batch script's OPENBLAS_CORETYPE, decided on the compute node (see
    blas_coretype_decision): a value in the job's environment is kept."""
    if args.blas_coretype == "keep":
        return ["# --blas-coretype keep: OPENBLAS_CORETYPE as the job's environment has it"]
    if args.blas_coretype != "auto":
        return [f"export OPENBLAS_CORETYPE=${{OPENBLAS_CORETYPE-{args.blas_coretype}}}"]
    check = st.quote(["srun", "--ntasks=1", "--nodes=1", study["exe"], "check", study["deck"], "--world",
                      str(p["ranks"])] + [x for o in p["overrides"] for x in ("--set", o)])
    return ["# ndmini check warns, with the fix, when OpenBLAS runs a kernel below this node's CPU (an OpenBLAS",
            "# older than the CPU model): unless the job sets OPENBLAS_CORETYPE, take the kernel it suggests.",
            'if [[ -z "${OPENBLAS_CORETYPE+set}" ]]; then',
            f"  coretype=$({check} 2>&1 | sed -n 's/.*Fix: export OPENBLAS_CORETYPE=\\([A-Za-z0-9_]*\\).*/\\1/p' "
            "| head -n 1)",
            '  if [[ -n "$coretype" ]]; then',
            '    export OPENBLAS_CORETYPE="$coretype"',
            '    echo "OPENBLAS_CORETYPE=$coretype set: ndmini check warns that OpenBLAS runs a kernel below this '
            'CPU\'s" >&2',
            "  fi",
            "fi"]


def emit_sbatch(study, study_dir, args):
    scripts = []
    for p in study["points"]:
        if p.get("precheck_error"):
            for k in range(1, study["repeats"] + 1):
                record_failure(os.path.join(p["dir"], f"rep{k}"), p["precheck_error"])
            print(f"{p['label']}: refused, not emitted: {p['precheck_error']}", file=sys.stderr)
            continue
        path = os.path.join(p["dir"], "job.sbatch")
        with open(path, "w") as f:
            f.write(sbatch_script(study, p, args))
        os.chmod(path, 0o755)
        scripts.append(path)
    submit = os.path.join(study_dir, "submit_all.sh")
    with open(submit, "w") as f:
        f.write("#!/bin/bash\n# Submits every point of the study; collect.sh builds the table when they are done.\n"
                "set -euo pipefail\n")
        for s in scripts:
            f.write(f"sbatch {st.quote([s])}\n")
    collect = os.path.join(study_dir, "collect.sh")
    with open(collect, "w") as f:
        f.write("#!/bin/bash\n# Builds results.csv, results.md and scaling.png from the finished runs.\n"
                f"exec python3 {st.quote([os.path.join(HERE, 'collect.py')])} {st.quote([study_dir])} \"$@\"\n")
    for path in (submit, collect):
        os.chmod(path, 0o755)
    return scripts


def slurm_seconds(text):
    """Seconds of a Slurm time limit (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None if not one."""
    days, dash, clock = text.rpartition("-")
    try:
        parts = [int(x) for x in clock.split(":")]
        days = int(days) if days else 0
    except ValueError:
        return None
    if not 1 <= len(parts) <= 3:
        return None
    if dash:  # after D-, the first field is hours
        parts += [0] * (3 - len(parts))
    else:  # MM, MM:SS, HH:MM:SS
        parts = {1: [0, parts[0], 0], 2: [0] + parts, 3: parts}[len(parts)]
    return days * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def check_numbers(args):
    for name, value, least in (("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                               ("--global-batch", args.global_batch, 1), ("--micro-batch", args.micro_batch, 1),
                               ("--signal-grace", args.signal_grace, 0)):
        if value is not None and value < least:
            raise st.StudyError(f"{name} {value}: must be at least {least}")
    limit = slurm_seconds(args.time)
    if args.emit_sbatch and args.signal_grace and limit is not None and args.signal_grace >= limit:
        raise st.StudyError(f"--signal-grace {args.signal_grace} s is not less than --time {args.time} ({limit} s): "
                            f"the signal would stop every run at its start; lower --signal-grace or raise --time")


def check_paths(args):
    """Every path argument, before anything opens or creates it."""
    st.check_input_file("deck", args.deck, "a deck (TOML) such as inputs/small.toml")
    for flag, path in (("--out", args.out), ("--emit-sbatch", args.emit_sbatch)):
        if path:
            st.check_output_dir(flag, path)


def refusal_note(study, allow_missing):
    """' (LABEL: reason; ...)' for the count of refused points in a summary line, and what the exit makes of them."""
    refused = [p for p in study["points"] if p.get("precheck_error")]
    if not refused:
        return ""
    return (" (" + "; ".join(f"{p['label']}: {p['precheck_error']}" for p in refused) + ")" +
            ("" if allow_missing else "; exit 1 (--allow-missing accepts a study without them)"))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_paths(args)
        check_numbers(args)
        predict.check_options(args.cluster, args.predict_cluster, args.predict_to,
                              "explicit" if args.point else args.layout)
        study, study_dir, deck_path = build_study(args)
        predictions = predict.predict(study, study_dir, deck_path, args.cluster, args.predict_cluster,
                                      args.predict_to)
        write_plan(study, study_dir, deck_path)
        predict.write_predictions(study, study_dir, predictions)
        precheck(study, args)
        if args.emit_sbatch:
            scripts = emit_sbatch(study, study_dir, args)
            write_plan(study, study_dir, deck_path)
            total = len(study["points"])
            refused = f", {total - len(scripts)} refused" if len(scripts) < total else ""
            print(f"scaling.py: {len(scripts)} of {total} points emitted{refused}"
                  f"{refusal_note(study, args.allow_missing)}", file=sys.stderr)
            if study.get("prediction"):
                _, rows = st.collect(study_dir)
                print("predicted by ndmini plan (docs/planner.md), before anything runs:")
                for line in st.prediction_lines(rows):
                    print("  " + line)
            if scripts:
                print(f"{len(scripts)} batch scripts in {study_dir}/points/*/job.sbatch; submit with "
                      f"{study_dir}/submit_all.sh, then build the table with {study_dir}/collect.sh")
            else:
                print(f"no batch script written in {study_dir}: every point was refused")
            return 0 if len(scripts) == total or (scripts and args.allow_missing) else 1
        run_points(study, args)
        write_plan(study, study_dir, deck_path)
        study, rows, paths = st.write_outputs(study_dir)
    except st.StudyError as e:
        print(f"scaling.py: error: {e}", file=sys.stderr)
        return 2
    with open(paths[1]) as f:
        print(f.read())
    if not any(p.endswith(".png") for p in paths):
        print(st.matplotlib_hint("scaling.py"), file=sys.stderr)
    print("wrote " + ", ".join(paths), file=sys.stderr)
    code, line = st.outcome(study, rows)
    print(f"scaling.py: {line}" + refusal_note(study, args.allow_missing), file=sys.stderr)
    if st.prediction_summary(rows):
        print(f"scaling.py: {st.prediction_summary(rows)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
