# SPDX-License-Identifier: BSD-3-Clause
"""A scaling study of ndmini: its points, their runs, and the table they make.

Shared by scaling.py (plan, run, or emit Slurm batch scripts) and collect.py
(build the table from a study directory afterwards). Python 3 standard
library only; the figure needs matplotlib and is skipped without it.

A study directory holds:
  study.json                 the plan: deck, mode, points, steps, warm-up, repeats, provenance
  deck.toml                  the deck as given (its SHA-256 is in the provenance)
  points/<label>/point.json  one point: ranks, degrees, batch, overrides, placement, and
                             precheck_error when the point was refused before any run
  points/<label>/repK/       one run: stdout.log, stderr.log, metrics.jsonl, exit_code,
                             hosts, build_info.json, slurm_job_id (under Slurm), and
                             interrupted-<job id>/ (the files of a job that stopped it)
  results.csv, results.md, scaling.png   written by the collector
"""

import csv
import datetime
import hashlib
import json
import math
import os
import re
import shlex
import socket
import stat
import statistics
import subprocess
import sys

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # mesh order, outermost first
FIXED_RULES = {"dp": "dp_replicate", "fsdp": "dp_shard"}


class StudyError(Exception):
    """A bad argument or study directory: one message that says what to fix."""


# ndmini's own bounds: a deck or cluster file of at most 1 MiB (kDeckMaxBytes in
# src/config/config.hpp) and a world of at most 2^20 ranks (kMaxWorld in miniapp/command_line.cpp).
INPUT_MAX_BYTES = 1 << 20
MAX_WORLD = 1 << 20


def file_kind(mode):
    """What a path that is not a regular file is, in words."""
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return word
    return "not a regular file"


def check_input_file(what, path, example):
    """Refuses an input path before anything opens it: it must be a regular file
    (open() on a FIFO waits for a writer forever) of at most INPUT_MAX_BYTES."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise StudyError(f"{what} {path}: no such file; give {example}") from None
    except OSError as e:
        raise StudyError(f"{what} {path}: cannot be read ({e.strerror}); give {example}") from None
    if not stat.S_ISREG(info.st_mode):
        raise StudyError(f"{what} {path}: {file_kind(info.st_mode)}, not a regular file; give {example}")
    if info.st_size > INPUT_MAX_BYTES:
        raise StudyError(f"{what} {path}: {info.st_size} bytes, more than the {INPUT_MAX_BYTES} ndmini reads; "
                         f"give {example}")
    if not os.access(path, os.R_OK):
        raise StudyError(f"{what} {path}: not readable; give {example}")


def check_output_dir(what, path):
    """Refuses an output directory that names something else (a file, a FIFO)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise StudyError(f"{what} {path}: cannot be used ({e.strerror}); give a new or existing directory") from None
    if not stat.S_ISDIR(info.st_mode):
        raise StudyError(f"{what} {path}: exists and is {file_kind(info.st_mode) if not stat.S_ISREG(info.st_mode) else 'a file'}, "
                         f"not a directory; give a new or existing study directory")


# --- Layout rules ------------------------------------------------------------------


def parse_degrees(text):
    """'tp=2,dp_shard=-1' -> {'tp': 2, 'dp_shard': -1}."""
    degrees = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        axis, _, value = item.partition("=")
        if axis not in AXES and axis != "rest":
            raise StudyError(f"layout '{text}': unknown axis '{axis}' (axes: {', '.join(AXES)}; or rest=AXIS)")
        if axis == "rest":
            if value not in AXES:
                raise StudyError(f"layout '{text}': rest={value} must name an axis ({', '.join(AXES)})")
            degrees["rest"] = value
            continue
        try:
            degrees[axis] = int(value)
        except ValueError:
            raise StudyError(f"layout '{text}': {axis}={value} is not an integer degree") from None
        if degrees[axis] < 1:
            raise StudyError(f"layout '{text}': {axis}={value} must be at least 1")
    return degrees


def layout_degrees(rule, ranks):
    """The five degrees of a point of `ranks` ranks under a layout rule.

    dp          all ranks on dp_replicate (pure data parallelism)
    fsdp        all ranks on dp_shard (fully sharded)
    AXIS=D,...  fixed degrees (e.g. tp=2, or pp=2,tp=2); the rest of the ranks
                on dp_replicate, or on the axis named by rest=AXIS (tp=2,rest=dp_shard)
    """
    degrees = {a: 1 for a in AXES}
    if rule in FIXED_RULES:
        degrees[FIXED_RULES[rule]] = ranks
        return degrees
    fixed = parse_degrees(rule)
    rest = fixed.pop("rest", "dp_replicate")
    if rest in fixed:
        raise StudyError(f"layout '{rule}': rest={rest} is also given a fixed degree")
    product = math.prod(fixed.values()) if fixed else 1
    if ranks % product:
        raise StudyError(f"layout '{rule}' on {ranks} ranks: the fixed degrees multiply to {product}, "
                         f"which does not divide {ranks}; choose rank counts that are multiples of {product}")
    degrees.update(fixed)
    degrees[rest] = ranks // product
    return degrees


def explicit_point(text):
    """'4:tp=2,dp_shard=2' -> (4, degrees); the degrees must multiply to the ranks."""
    ranks, sep, spec = text.partition(":")
    try:
        ranks = int(ranks)
    except ValueError:
        raise StudyError(f"--point '{text}': expected RANKS:AXIS=D,... e.g. 4:tp=2,dp_shard=2") from None
    if not sep or ranks < 1:
        raise StudyError(f"--point '{text}': expected RANKS:AXIS=D,... e.g. 4:tp=2,dp_shard=2")
    given = parse_degrees(spec)
    if "rest" in given:
        raise StudyError(f"--point '{text}': give every degree explicitly (no rest=)")
    degrees = {a: 1 for a in AXES}
    degrees.update(given)
    if math.prod(degrees.values()) != ranks:
        raise StudyError(f"--point '{text}': the degrees multiply to {math.prod(degrees.values())}, not {ranks}")
    return ranks, degrees


def mesh_text(degrees):
    """The mesh as ndmini prints it: 'pp=1 dp_replicate=2 dp_shard=1 cp=1 tp=1'."""
    return " ".join(f"{a}={degrees[a]}" for a in AXES)


def short_layout(degrees):
    """'dp_replicate=2' or 'dp_shard=2,tp=2'; '1 rank' for the trivial mesh."""
    parts = [f"{a}={degrees[a]}" for a in AXES if degrees[a] > 1]
    return ",".join(parts) if parts else "single"


def data_parallel(degrees):
    """The ranks that share the global batch: dp_replicate x dp_shard."""
    return degrees["dp_replicate"] * degrees["dp_shard"]


def fitted_micro_batch(per_rank, cap):
    """The largest divisor of a data-parallel rank's batch that is not above cap."""
    return max(d for d in range(1, min(per_rank, cap) + 1) if per_rank % d == 0)


def point_label(ranks, degrees):
    return f"n{ranks:04d}_" + ("_".join(f"{a}{degrees[a]}" for a in AXES if degrees[a] > 1) or "single")


def point_batch(mode, degrees, deck_batch, batch_per_rank, deck_micro, micro_fixed):
    """(global batch, batch per data-parallel rank, micro-batch, refusal) of a point;
    refusal is '' or why the point cannot run."""
    dp = data_parallel(degrees)
    if mode == "weak":
        batch, per_rank = batch_per_rank * dp, batch_per_rank
    else:
        batch, per_rank = deck_batch, deck_batch // dp
        if deck_batch % dp:
            return batch, None, micro_fixed or deck_micro, (
                f"strong scaling keeps the global batch of {batch} sequences, which {dp} data-parallel ranks "
                f"(dp_replicate x dp_shard) cannot share; give --global-batch a multiple of {dp}")
    if not micro_fixed:
        return batch, per_rank, fitted_micro_batch(per_rank, deck_micro), ""
    if per_rank % micro_fixed:
        return batch, per_rank, micro_fixed, (
            f"--micro-batch {micro_fixed} does not divide the {per_rank} sequences of each of the {dp} data-parallel "
            f"ranks (global batch {batch}); give a divisor of {per_rank}, or leave --micro-batch out to fit it")
    return batch, per_rank, micro_fixed, ""


def make_point(study, ranks, degrees, base_dir, ranks_per_node, gpus_per_task):
    """One point of a study under its batch rule: the overrides its run (or its
    prediction) gets, its placement, and precheck_error when the rule refuses it."""
    batch, per_rank, micro, refusal = point_batch(study["mode"], degrees, study["global_batch"],
                                                  study["batch_per_rank"], study["deck_micro_batch"],
                                                  study["micro_batch_fixed"])
    rpn = min(ranks_per_node or ranks, ranks)
    label = point_label(ranks, degrees)
    overrides = list(study["overrides"]) + [f"parallel.{a}={degrees[a]}" for a in AXES] + [
        f"train.global_batch={batch}", f"train.micro_batch={micro}", f"train.steps={study['steps']}",
        "train.log_every=1"]
    return {"label": label, "ranks": ranks, "degrees": degrees, "global_batch": batch, "batch_per_rank": per_rank,
            "micro_batch": micro, "nodes": math.ceil(ranks / rpn), "ranks_per_node": rpn, "tasks_per_node": rpn,
            "gpus_per_task": gpus_per_task, "dir": os.path.join(base_dir, label), "overrides": overrides,
            **({"precheck_error": refusal} if refusal else {})}


# --- Decks -------------------------------------------------------------------------


def deck_value(text, section, key):
    """A scalar of a TOML deck (enough TOML for the keys the study needs), or None."""
    current = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"\[([A-Za-z0-9_.]+)\]", line)
        if m:
            current = m.group(1)
            continue
        m = re.fullmatch(r"([A-Za-z0-9_]+)\s*=\s*(.+)", line)
        if m and current == section and m.group(1) == key:
            value = m.group(2).strip()
            try:
                return int(value)
            except ValueError:
                try:
                    return float(value)
                except ValueError:
                    return value.strip('"')
    return None


def overridden(overrides, section, key):
    """The value a list of 'section.key=value' overrides gives, or None."""
    value = None
    for o in overrides:
        name, _, v = o.partition("=")
        if name == f"{section}.{key}":
            value = v
    return value


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- Provenance --------------------------------------------------------------------


def git_state(repo):
    """(sha, dirty) of a source checkout, or ('unknown', None)."""
    try:
        sha = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip() != ""
        return sha, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None


def build_info(exe, launcher_prefix=()):
    """`ndmini --build-info` as a dict; {} when the binary cannot say (missing, or too old)."""
    for prefix in ((), tuple(launcher_prefix)):
        try:
            out = subprocess.run(list(prefix) + [exe, "--build-info"], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in out.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    pass
    return {}


def environment_provenance():
    """What the harness itself can see: host, Slurm, time, threads."""
    env = os.environ
    return {
        "harness_host": socket.gethostname(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "slurm_job_id": env.get("SLURM_JOB_ID", ""),
        "slurm_nodelist": env.get("SLURM_JOB_NODELIST", ""),
        "openblas_num_threads": env.get("OPENBLAS_NUM_THREADS", ""),
        "omp_num_threads": env.get("OMP_NUM_THREADS", ""),
    }


# --- Metrics of one run ------------------------------------------------------------


def read_metrics(path):
    """(step records, summary or None) of an `ndmini train --metrics` file."""
    steps, summary = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            if not isinstance(rec, dict) or rec.get("record") == "header":
                continue  # the header (version, git_sha, deck, config, host, start_time) describes, not measures
            if rec.get("summary"):
                summary = rec
            elif "step" in rec:
                steps.append(rec)
    return steps, summary


BANNER = re.compile(r"ranks/node (\d+)")


def ranks_per_node_from_log(path):
    """The banner's 'ranks/node N' (rank 0's node), or None."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = BANNER.search(line)
                if m:
                    return int(m.group(1))
    except OSError:
        pass
    return None


def error_message(run_dir, exit_code):
    """The reason a run failed: ndmini's own error line, else the end of its output."""
    lines = []
    for name in ("stderr.log", "stdout.log"):
        try:
            with open(os.path.join(run_dir, name), errors="replace") as f:
                lines += [line.rstrip() for line in f]
        except OSError:
            pass
    for line in lines:
        if "ndmini: error:" in line or "ndmini: collective timeout" in line or "first divergence" in line:
            return line.strip()
    tail = [line for line in lines if line.strip()][-3:]
    what = f"exit code {exit_code}" if exit_code is not None else "no exit code recorded (the job did not finish)"
    return what + (": " + " | ".join(tail) if tail else "")


def summarize_run(run_dir, warmup):
    """One run's figures over its steps after the warm-up, or a failure.

    Per kept step: step_ms, tokens_per_s, exposed comm per communicator, and
    (when the trainer writes them) bubble_ms and io_ms. The compute time is
    what is left: step - exposed comm. The bubble is a part of the pp
    group's exposed time, and step_ms leaves the checkpoint I/O out, so
    neither is subtracted again.
    """
    # A run that left nothing in its folder never started (an emitted batch job not submitted).
    started = os.path.isdir(run_dir) and any(os.scandir(run_dir))
    run = {"dir": run_dir, "ok": False, "started": started}
    code_file = os.path.join(run_dir, "exit_code")
    exit_code = None
    if os.path.exists(code_file):
        with open(code_file) as f:
            text = f.read().strip()
            exit_code = int(text) if text.lstrip("-").isdigit() else None
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if exit_code != 0 or not os.path.exists(metrics):
        run["message"] = error_message(run_dir, exit_code)
        return run
    steps, summary = read_metrics(metrics)
    kept = steps[warmup:]
    if not kept or summary is None:
        run["message"] = (f"{len(steps)} step records and {'a' if summary else 'no'} summary in {metrics}: "
                          f"nothing left after dropping {warmup} warm-up steps; raise --steps")
        return run
    comm_names = sorted({name for s in kept for name in s.get("comm", {})})
    per_step = {"step_ms": [], "tokens_per_s": [], "exposed_ms": [], "bubble_ms": [], "io_ms": [], "compute_ms": [],
                "exposed_min_ms": []}
    exposed_axis = {name: [] for name in comm_names}
    for s in kept:
        exposed = exposed_min = 0.0
        for name in comm_names:
            c = s.get("comm", {}).get(name, {})
            e = c.get("exposed_ms", 0.0)
            exposed_axis[name].append(e)
            exposed += e
            # The least-blocked rank's time, where the trainer reports it: the
            # communication itself, without waiting for slower ranks.
            exposed_min += c.get("exposed_min_ms", float("nan"))
        bubble = s.get("bubble_ms", 0.0)
        io = s.get("io_ms", 0.0)
        per_step["step_ms"].append(s["step_ms"])
        per_step["tokens_per_s"].append(s["tokens_per_s"])
        per_step["exposed_ms"].append(exposed)
        per_step["exposed_min_ms"].append(exposed_min)
        per_step["bubble_ms"].append(bubble)
        per_step["io_ms"].append(io)
        per_step["compute_ms"].append(s["step_ms"] - exposed)
    run.update({
        "ok": True,
        "steps_kept": len(kept),
        "median": {k: statistics.median(v) for k, v in per_step.items()},
        "exposed_axis": {k: statistics.median(v) for k, v in exposed_axis.items()},
        "step_ms_all": per_step["step_ms"],
        "mfu": statistics.median(s.get("mfu", 0.0) for s in kept),
        "mem_bytes": kept[-1].get("mem_bytes"),
        "peak_rss_bytes": summary.get("peak_rss_bytes"),
        "state_bytes": summary.get("state_bytes"),
        "io_total_ms": summary.get("io_ms"),
        "has_bubble": any("bubble_ms" in s for s in kept),
        "has_step_io": any("io_ms" in s for s in kept),
        "ranks_per_node": summary.get("ranks_per_node") or ranks_per_node_from_log(os.path.join(run_dir,
                                                                                                "stdout.log")),
    })
    return run


def read_text(path, default=""):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


# --- The study ---------------------------------------------------------------------


def load_study(study_dir):
    path = os.path.join(study_dir, "study.json")
    if not os.path.exists(path):
        raise StudyError(f"{study_dir}: no study.json; give the directory a study was planned in (--out or "
                         f"--emit-sbatch)")
    with open(path) as f:
        return json.load(f)


def save_study(study, study_dir):
    with open(os.path.join(study_dir, "study.json"), "w") as f:
        json.dump(study, f, indent=2)


def min_max(values):
    """(min, max) of a list; (nan, nan) for none."""
    return (min(values), max(values)) if values else (float("nan"), float("nan"))


def collect(study_dir):
    """Rows of the table, one per point (refused and failed points included), in rank order."""
    study = load_study(study_dir)
    prediction = study.get("prediction")
    rows = []
    for point in study["points"]:
        pdir = os.path.join(study_dir, "points", point["label"])
        runs = [summarize_run(os.path.join(pdir, f"rep{k}"), study["warmup"]) for k in range(1, study["repeats"] + 1)]
        good = [r for r in runs if r["ok"]]
        row = {**point_fields(study, point), "kind": "measured", "steps": study["steps"], "warmup": study["warmup"],
               "repeats": study["repeats"], "repeats_ok": len(good)}
        if point.get("precheck_error"):  # refused before any run: no run to read
            row["status"] = "refused"
            row["message"] = point["precheck_error"]
        elif not good and not any(r["started"] for r in runs):
            row["status"] = "not run"
            row["message"] = "no run of this point has started (its batch job not submitted, or still queued)"
        elif not good:
            row["status"] = "failed"
            row["message"] = "; ".join(sorted({r.get("message", "") for r in runs}))
        else:
            row["status"] = "ok" if len(good) == len(runs) else "partial"
            row["message"] = "; ".join(sorted({r.get("message", "") for r in runs if not r["ok"]}))
            tps = [r["median"]["tokens_per_s"] for r in good]
            ms = [r["median"]["step_ms"] for r in good]
            row["tokens_per_s"] = statistics.median(tps)
            row["tokens_per_s_min"], row["tokens_per_s_max"] = min_max(tps)
            row["tokens_per_s_per_rank"] = row["tokens_per_s"] / point["ranks"]
            row["step_ms"] = statistics.median(ms)
            row["step_ms_min"], row["step_ms_max"] = min_max(ms)
            pooled = sorted(v for r in good for v in r["step_ms_all"])
            row["step_ms_p25"] = pooled[len(pooled) // 4]
            row["step_ms_p75"] = pooled[(3 * len(pooled)) // 4]
            for part in ("compute_ms", "exposed_ms", "bubble_ms", "io_ms", "exposed_min_ms"):
                row[part.replace("exposed", "exposed_comm")] = statistics.median(r["median"][part] for r in good)
            names = sorted({n for r in good for n in r["exposed_axis"]})
            for n in names:
                row[f"exposed_{n}_ms"] = statistics.median(r["exposed_axis"].get(n, 0.0) for r in good)
            row["exposed_comm_share"] = row["exposed_comm_ms"] / row["step_ms"] if row["step_ms"] else 0.0
            row["bubble_measured"] = any(r["has_bubble"] for r in good)
            row["io_per_step_measured"] = any(r["has_step_io"] for r in good)
            row["io_total_ms"] = statistics.median(r["io_total_ms"] or 0.0 for r in good)
            row["mfu"] = statistics.median(r["mfu"] for r in good)
            row["mem_estimate_bytes"] = good[0]["mem_bytes"]
            row["state_bytes"] = good[0]["state_bytes"]
            row["peak_rss_bytes_rank0"] = max(r["peak_rss_bytes"] or 0 for r in good)
            rpn = [r["ranks_per_node"] for r in good if r["ranks_per_node"]]
            if rpn:
                row["ranks_per_node_measured"] = rpn[0]
        row.update(run_provenance(study, pdir))
        if prediction:
            row.update(prediction_fields(study, read_prediction(pdir), prediction["measured_cluster"]))
        rows.append(row)
    rows += predicted_rows(study, study_dir)
    # Rank order; at a rank count the measured point first, then its predictions on another cluster.
    rows.sort(key=lambda r: (r["ranks"], r.get("kind") == "predicted", r["label"]))
    add_scaling(rows)
    add_predicted_scaling(rows)
    return study, rows


def point_fields(study, point):
    """A row's description of a point: what it is, not what it measured."""
    return {
        "study": study["name"], "mode": study["mode"], "deck": study["deck_name"],
        "deck_sha256": study["provenance"].get("deck_sha256", ""),
        "label": point["label"], "ranks": point["ranks"], "nodes": point["nodes"],
        "ranks_per_node": point["ranks_per_node"], "gpus_per_task": point.get("gpus_per_task", 0),
        "layout": short_layout(point["degrees"]), "mesh": mesh_text(point["degrees"]),
        **{a: point["degrees"][a] for a in AXES},
        "global_batch": point["global_batch"], "micro_batch": point["micro_batch"], "seq_len": study["seq_len"],
    }


def run_provenance(study, pdir):
    """Provenance of a point's runs (the compute nodes' view under Slurm); the study's
    own where the point has no run (a predicted one)."""
    rep = os.path.join(pdir, "rep1")
    info = {}
    try:
        with open(os.path.join(rep, "build_info.json")) as f:
            info = json.load(f)
    except (OSError, json.JSONDecodeError):
        info = study["provenance"].get("build_info", {})
    return {
        "git_sha": info.get("git_sha") or study["provenance"].get("source_git_sha", "unknown"),
        "compiler": info.get("compiler", ""),
        "kokkos": f"{info.get('kokkos_version', '')} {info.get('kokkos_backend', '')}".strip(),
        "mpi": info.get("mpi_library", ""),
        "nccl": info.get("nccl") or "",
        "hosts": " ".join(read_text(os.path.join(pdir, f"rep{k}", "hosts")) for k in range(1, 2)).strip(),
        "slurm_job_id": read_text(os.path.join(rep, "slurm_job_id")),
        "launcher": study.get("launcher", ""),
    }


# --- Predictions (written by predict.py as plan.json beside each point) ------------


def read_prediction(pdir):
    """A point's plan.json (what `ndmini plan` said of it), or None."""
    try:
        with open(os.path.join(pdir, "plan.json")) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def gib(n):
    return n / 2**30


def prediction_fields(study, record, tag):
    """The predicted_* columns of a row: the planner's figures for its layout on cluster `tag`,
    or why there are none (refused by the batch rule or the planner, or does not fit)."""
    fields = {"predicted_cluster": tag, "predicted_cluster_name": study["prediction"]["clusters"][tag]["name"]}
    if record is None:
        return {**fields, "predicted_status": "missing",
                "predicted_message": "no plan.json: collect.py STUDY --cluster FILE predicts it"}
    if not record["ok"]:
        return {**fields, "predicted_status": "refused", "predicted_message": record["message"]}
    layout = record["plan"]["layouts"][0]
    time_ms = layout["time_ms"]
    fields.update({
        "predicted_status": "fits" if layout["fits"] else "does not fit",
        "predicted_step_ms": time_ms["step"], "predicted_tokens_per_s": layout["tokens_per_s"],
        "predicted_mfu": layout["mfu"], "predicted_exposed_comm_ms": time_ms["exposed_comm"],
        "predicted_bubble_ms": time_ms["bubble"], "predicted_memory_bytes": layout["memory_bytes"]["total"],
        "predicted_message": "",
    })
    if not layout["fits"]:
        fields["predicted_message"] = (
            f"{gib(layout['memory_bytes']['total']):.2f} GiB per device, above device.memory_gib = "
            f"{study['prediction']['clusters'][tag]['memory_gib']} of {study['prediction']['clusters'][tag]['file']}")
    return fields


def predicted_rows(study, study_dir):
    """One row per predicted-only point (--predict-to), marked kind = predicted."""
    rows = []
    for point in study.get("predicted_points", []):
        pdir = os.path.join(study_dir, "predicted", point["cluster"], point["label"])
        row = {**point_fields(study, point), "kind": "predicted", **run_provenance(study, pdir),
               **prediction_fields(study, read_prediction(pdir), point["cluster"])}
        row["status"] = "predicted" if row["predicted_status"] == "fits" else row["predicted_status"]
        row["message"] = row["predicted_message"]
        rows.append(row)
    return rows


def add_predicted_scaling(rows):
    """Predicted speed-up and efficiency, per cluster, against that cluster's prediction
    of its smallest point that fits (as add_scaling does with the measured figures)."""
    for tag in {r["predicted_cluster"] for r in rows if "predicted_cluster" in r}:
        fits = [r for r in rows if r.get("predicted_cluster") == tag and r["predicted_status"] == "fits"]
        if not fits:
            continue
        base = min(fits, key=lambda r: r["ranks"])
        for r in fits:
            r["predicted_baseline_ranks"] = base["ranks"]
            r["predicted_speedup"] = r["predicted_tokens_per_s"] / base["predicted_tokens_per_s"]
            r["predicted_efficiency"] = r["predicted_speedup"] / (r["ranks"] / base["ranks"])
            r["predicted_tokens_per_s_per_rank"] = r["predicted_tokens_per_s"] / r["ranks"]
            if r.get("step_ms"):
                r["predicted_step_error"] = r["predicted_step_ms"] / r["step_ms"] - 1


def measured(rows):
    """The rows with figures: every run or some of them succeeded."""
    return [r for r in rows if r["status"] in ("ok", "partial")]


def add_scaling(rows):
    """Speed-up and parallel efficiency against the smallest successful point.

    Strong scaling (fixed global batch): speed-up = tokens/s(n) / tokens/s(n0),
    the inverse ratio of step times. Weak scaling (fixed batch per rank): the
    same ratio is the scaled speed-up. Ideal = n / n0 either way; efficiency
    = speed-up / ideal (for weak scaling, the per-rank throughput kept).
    """
    ok = measured(rows)
    if not ok:
        return
    base = min(ok, key=lambda r: r["ranks"])
    for r in ok:
        r["baseline_ranks"] = base["ranks"]
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["ideal_speedup"] = r["ranks"] / base["ranks"]
        r["efficiency"] = r["speedup"] / r["ideal_speedup"]


CSV_FIRST = ["study", "mode", "deck", "label", "status", "ranks", "nodes", "ranks_per_node", "gpus_per_task",
             "layout", "mesh", *AXES, "global_batch", "micro_batch", "seq_len", "steps", "warmup", "repeats",
             "repeats_ok", "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max", "tokens_per_s_per_rank",
             "speedup", "ideal_speedup", "efficiency", "baseline_ranks", "step_ms", "step_ms_min", "step_ms_max",
             "step_ms_p25", "step_ms_p75", "compute_ms", "exposed_comm_ms", "exposed_comm_min_ms",
             "exposed_comm_share", "bubble_ms",
             "bubble_measured", "io_ms", "io_per_step_measured", "io_total_ms", "mfu", "mem_estimate_bytes",
             "state_bytes", "peak_rss_bytes_rank0", "ranks_per_node_measured"]
PREDICTED_COLUMNS = ["predicted_cluster", "predicted_status", "predicted_step_ms", "predicted_step_error",
                     "predicted_tokens_per_s", "predicted_tokens_per_s_per_rank", "predicted_speedup",
                     "predicted_efficiency", "predicted_baseline_ranks", "predicted_mfu", "predicted_exposed_comm_ms",
                     "predicted_bubble_ms", "predicted_memory_bytes", "predicted_cluster_name", "predicted_message"]
CSV_LAST = ["git_sha", "compiler", "kokkos", "mpi", "nccl", "hosts", "slurm_job_id", "launcher", "deck_sha256",
            "message"]


def csv_columns(rows):
    axis_cols = sorted({k for r in rows for k in r if k.startswith("exposed_") and k.endswith("_ms")
                        and k not in ("exposed_comm_ms", "exposed_comm_min_ms")})
    cols = CSV_FIRST[:CSV_FIRST.index("exposed_comm_share")] + axis_cols + CSV_FIRST[
        CSV_FIRST.index("exposed_comm_share"):]
    if any("predicted_cluster" in r for r in rows):  # a study with predictions: which rows are which, and them
        cols = cols[:cols.index("status") + 1] + ["kind"] + cols[cols.index("status") + 1:] + PREDICTED_COLUMNS
    return cols + CSV_LAST


def write_csv(path, rows):
    cols = csv_columns(rows)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else "-"


def batch_rule(study):
    """How the study sized each point's batch, for the table's header."""
    if study["mode"] == "weak" and study.get("batch_per_rank"):
        return (f"weak scaling: a fixed batch per data-parallel rank ({study['batch_per_rank']} sequences; "
                f"global batch = {study['batch_per_rank']} x dp_replicate x dp_shard of each point)")
    if study["mode"] == "strong" and study.get("global_batch"):
        micro = (f"micro-batch {study['micro_batch_fixed']} at every point" if study.get("micro_batch_fixed")
                 else "the micro-batch fitted to each point")
        return f"strong scaling: a fixed global batch ({study['global_batch']} sequences; {micro})"
    # A study planned by an older harness, which did not record its rule.
    return {"weak": "weak scaling", "strong": "strong scaling (fixed global batch)"}[study["mode"]]


def prediction_note(study):
    """What the predicted columns and rows are: the clusters, and how far the rule was carried."""
    pred = study["prediction"]
    clusters = pred["clusters"]
    lines = ["Predicted by `ndmini plan` (docs/planner.md) for each point's layout, batch and overrides; dashed in "
             "scaling.png. Predicted efficiency is against the same cluster's prediction of its smallest point.", ""]
    measured_tag = pred["measured_cluster"]
    lines.append(f"- beside every measured point: {measured_tag} = {clusters[measured_tag]['name']} "
                 f"({clusters[measured_tag]['file']})")
    if pred.get("predict_to"):
        tag = pred["extension_cluster"]
        lines.append(f"- rows marked predicted ({tag}): the layout rule {study['layout_rule']} carried on to "
                     f"{'every measured rank count and ' if tag != measured_tag else ''}the powers of two up to "
                     f"{pred['predict_to']} ranks, predicted only, on {tag} = {clusters[tag]['name']} "
                     f"({clusters[tag]['file']})")
    for note in pred.get("skipped", []):
        lines.append(f"- not predicted: {note}")
    for note in pred.get("notes", []):
        lines.append(f"- note: {note}")
    return lines + [""]


def predicted_cells(r):
    """The predicted columns of a row of results.md."""
    status = r.get("predicted_status")
    if status != "fits":
        return f" {status or '-'}{': ' + r['predicted_message'] if r.get('predicted_message') else ''} | | | |"
    error = f" ({100 * r['predicted_step_error']:+.0f}%)" if "predicted_step_error" in r else ""
    return (f" {r['predicted_step_ms']:.4g}{error} | {r['predicted_tokens_per_s']:.0f} | "
            f"{fmt(r.get('predicted_efficiency'), '.3f')} | {fmt(r.get('mfu'), '.3f')} / {r['predicted_mfu']:.3f} |")


def markdown(study, rows):
    lines = [f"# {study['name']}: {batch_rule(study)} of {study['deck_name']}", ""]
    predicted = bool(study.get("prediction"))
    if predicted:
        lines += prediction_note(study)
    lines += ["| ranks | layout | batch: global / micro | tokens/s (min-max) | tokens/s/rank | speed-up | efficiency "
              "| exposed comm share | step ms: compute / comm (of it bubble); I/O outside the step |" +
              (" predicted step ms (vs measured) | predicted tokens/s | predicted efficiency | MFU: measured / "
               "predicted |" if predicted else ""),
              "|---:|---|---:|---:|---:|---:|---:|---:|---|" + ("---:|---:|---:|---:|" if predicted else "")]
    for r in rows:
        batch = f"{r['global_batch']} / {r['micro_batch']}"
        tail = predicted_cells(r) if predicted else ""
        if r.get("kind") == "predicted":
            lines.append(f"| {r['ranks']} | {r['layout']} | {batch} | predicted ({r['predicted_cluster']}) | | | | | |"
                         + tail)
            continue
        if r["status"] in ("failed", "refused", "not run"):
            lines.append(f"| {r['ranks']} | {r['layout']} | {batch} | {r['status']} | | | | | {r['message']} |" + tail)
            continue
        bubble = fmt(r["bubble_ms"], ".1f") if r["bubble_measured"] else "n/a"
        io = fmt(r["io_ms"], ".1f") if r["io_per_step_measured"] else "n/a"
        lines.append(
            f"| {r['ranks']} | {r['layout']} | {batch} | {r['tokens_per_s']:.0f} ({r['tokens_per_s_min']:.0f}-"
            f"{r['tokens_per_s_max']:.0f}) | {r['tokens_per_s_per_rank']:.0f} | {r['speedup']:.2f} | "
            f"{r['efficiency']:.3f} | {100 * r['exposed_comm_share']:.1f}% | {r['compute_ms']:.1f} / "
            f"{r['exposed_comm_ms']:.1f} ({bubble}) / {io} |" + tail)
    p = study["provenance"]
    ok = measured(rows)
    first = ok[0] if ok else (rows[0] if rows else {})
    if any(r.get("kind") == "predicted" for r in rows):
        lines += ["", "Rows marked predicted ran nothing: their figures are the planner's alone."]
    lines += ["", f"Medians over {study['repeats']} run(s) per point of the steps after {study['warmup']} warm-up "
              f"step(s) ({study['steps']} steps per run; min-max over runs). Speed-up and efficiency against the "
              f"{first.get('baseline_ranks', '-')}-rank point; ideal speed-up = ranks / baseline ranks. Times are the "
              "slowest rank's; comm is the exposed (not overlapped) time summed over communicators.", ""]
    lines += ["Provenance:", "",
              f"- ndmini {first.get('git_sha', 'unknown')}, {first.get('compiler', '')}, Kokkos "
              f"{first.get('kokkos', '')}, {first.get('mpi', '')}" + (f", NCCL {first['nccl']}" if first.get("nccl")
                                                                       else ""),
              f"- deck {study['deck_name']} (sha256 {p.get('deck_sha256', '')[:16]}), overrides: "
              f"{' '.join(study['overrides']) or 'none'}",
              f"- launcher {study.get('launcher', '')}, hosts {first.get('hosts', '')}, date {p.get('date_utc', '')}"
              + (f", Slurm job {first['slurm_job_id']}" if first.get("slurm_job_id") else "")]
    if p.get("openblas_coretype_note"):
        lines.append(f"- OpenBLAS kernel: {p['openblas_coretype_note']}")
    missing = []
    if ok and all(math.isnan(r.get("exposed_comm_min_ms", float("nan"))) for r in ok):
        missing.append("the least-blocked rank's exposed comm (no per-axis exposed_min_ms: the comm times are the "
                       "slowest rank's, which include waiting for slower ranks)")
    if ok and not any(r["bubble_measured"] for r in ok):
        missing.append("bubble (no per-step bubble_ms in the metrics)")
    if ok and not any(r["io_per_step_measured"] for r in ok):
        missing.append("I/O per step (no per-step io_ms; io_total_ms in the CSV is the run's checkpoint time)")
    if missing:
        lines += [f"- not measured by this ndmini: {'; '.join(missing)}"]
    return "\n".join(lines) + "\n"


def layout_family(r):
    """The axes above 1 of a row's layout ('single' for one rank): one line in the figure."""
    return ",".join(a for a in AXES if r[a] > 1) or "single"


def predicted_series(rows):
    """{(cluster tag, family): rows whose prediction fits, by ranks}: the dashed lines."""
    series = {}
    for r in rows:
        if r.get("predicted_status") == "fits":
            series.setdefault((r["predicted_cluster"], layout_family(r)), []).append(r)
    return series


def plot_subtitle(study, rows):
    """The figure's second line: the batch per rank, the steps and repeats, and the machines."""
    if study["mode"] == "weak" and study.get("batch_per_rank"):
        batch = f"{study['batch_per_rank']} sequences per data-parallel rank"
    elif study.get("global_batch"):
        batch = f"global batch {study['global_batch']} sequences"
    else:
        batch = "the deck's batch"
    ok = measured(rows)
    hosts = sorted({r["hosts"] for r in ok if r.get("hosts")})
    where = [f"measured on {', '.join(hosts) or 'this machine'}"] if ok else []
    clusters = study.get("prediction", {}).get("clusters", {})
    tags = sorted({r["predicted_cluster"] for r in rows if r.get("predicted_status") == "fits"})
    if tags:
        where.append("predicted for " + ", ".join(
            f"{t} ({os.path.basename(clusters[t]['file'])})" if t in clusters else t for t in tags))
    return (f"{batch} of {study['seq_len']} tokens; {study['steps']} steps per run, {study['warmup']} warm-up "
            f"dropped, {study['repeats']} run(s) per point (bars: min-max over them)\n" + "; ".join(where))


def plot(study, rows, path):
    """Tokens/s, speed-up and efficiency against the ideal: the measured points (solid, with
    min-max bars over the repeats) in one row of panels, the predicted ones (dashed, one
    marker per cluster) in another, as they may lie decades apart; one colour per layout
    family in both. False when matplotlib is missing or nothing has figures."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = measured(rows)
    predicted = predicted_series(rows)
    if not ok and not predicted:
        return False
    # One line per layout family (the axes above 1); the single-rank point starts each.
    families = sorted(({layout_family(r) for r in ok} | {fam for _, fam in predicted}) - {"single"}) or ["single"]
    colors = {fam: f"C{k}" for k, fam in enumerate(families)}
    panels = (["measured"] if ok else []) + (["predicted"] if predicted else [])
    fig, axes = plt.subplots(len(panels), 3, figsize=(15, 4.2 * len(panels) + 0.6), squeeze=False)
    for row_axes, kind in zip(axes, panels):
        t, a, b = row_axes
        if kind == "measured":
            ranks = sorted({r["ranks"] for r in ok})
            base = ok[0]["baseline_ranks"]
            base_tps = next(r["tokens_per_s"] for r in ok if r["ranks"] == base)
            for fam in families:
                series = sorted((r for r in ok if layout_family(r) in (fam, "single")), key=lambda r: r["ranks"])
                if not series:
                    continue
                x = [r["ranks"] for r in series]
                tps = [r["tokens_per_s"] for r in series]
                low = [r["tokens_per_s"] - r["tokens_per_s_min"] for r in series]
                high = [r["tokens_per_s_max"] - r["tokens_per_s"] for r in series]
                ideal = [r["ideal_speedup"] for r in series]
                style = dict(fmt="o-", color=colors[fam], capsize=4, label=f"{fam}, measured")
                t.errorbar(x, tps, yerr=[low, high], **style)
                # The speed-up's bars: each repeat's extremes over the baseline's median.
                a.errorbar(x, [v / base_tps for v in tps], yerr=[[v / base_tps for v in low],
                                                                 [v / base_tps for v in high]], **style)
                b.errorbar(x, [v / base_tps / i for v, i in zip(tps, ideal)],
                           yerr=[[v / base_tps / i for v, i in zip(low, ideal)],
                                 [v / base_tps / i for v, i in zip(high, ideal)]], **style)
            title = "measured"
        else:
            ranks = sorted({r["ranks"] for rs in predicted.values() for r in rs})
            base = min(r["predicted_baseline_ranks"] for rs in predicted.values() for r in rs)
            markers = {}
            for (tag, fam), series in sorted(predicted.items()):
                if fam == "single" and fam not in colors:
                    continue  # the single-rank prediction starts every family's line
                series = sorted(series + [r for r in predicted.get((tag, "single"), []) if fam != "single"],
                                key=lambda r: r["ranks"])
                x = [r["ranks"] for r in series]
                style = dict(linestyle="--", marker=markers.setdefault(tag, "sx^v<>"[len(markers) % 6]),
                             color=colors[fam], markerfacecolor="none", label=f"{fam}, predicted ({tag})")
                t.plot(x, [r["predicted_tokens_per_s"] for r in series], **style)
                a.plot(x, [r["predicted_speedup"] for r in series], **style)
                b.plot(x, [r["predicted_efficiency"] for r in series], **style)
            title = "predicted by ndmini plan"
        ideal = [n for n in ranks if n >= base]
        a.plot(ideal, [n / base for n in ideal], "k:", label="ideal")
        b.plot(ideal, [1.0] * len(ideal), "k:", label="ideal")
        t.set_ylabel(f"tokens/s, {title}")
        a.set_ylabel(("speed-up" if study["mode"] == "strong" else "scaled speed-up") + f", {title}")
        b.set_ylabel(f"parallel efficiency, {title}")
        top = max([1.15] + [line.get_ydata().max() for line in b.get_lines() if len(line.get_ydata())])
        b.set_ylim(0, 1.05 * top)
        wide = ranks[-1] / ranks[0] > 16  # a predicted extension: log axes
        for ax in (t, a, b):
            ax.set_xlabel("ranks")
            if len(ranks) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(ranks)
            ax.set_xticklabels([str(n) for n in ranks])
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
        if wide:
            t.set_yscale("log")
            a.set_yscale("log", base=2)
        b.legend(fontsize="small", loc="lower left")
    fig.suptitle(f"{study['name']}: {study['mode']} scaling of {study['deck_name']} ({', '.join(families)})\n"
                 f"{plot_subtitle(study, rows)}", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def outcome(study, rows):
    """(exit code, one summary line): 0 when every point ran and measured, or when the
    only missing points were refused and the study was planned with --allow-missing."""
    rows = [r for r in rows if r.get("kind") != "predicted"]
    counts = {k: sum(r["status"] == k for r in rows) for k in ("ok", "partial", "failed", "not run", "refused")}
    line = f"{counts['ok']} of {len(rows)} points measured"
    line += "".join(f", {counts[k]} {k}" for k in ("partial", "failed", "not run", "refused") if counts[k])
    missing_allowed = counts["refused"] == 0 or study.get("allow_missing", False)
    complete = counts["ok"] > 0 and counts["ok"] + counts["refused"] == len(rows) and missing_allowed
    return (0 if complete else 1), line


def prediction_summary(rows):
    """'predicted by ndmini plan: 3 points on here, 9 on h100 (1 does not fit, 2 refused)', or ''."""
    by_tag = {}
    for r in rows:
        if "predicted_cluster" in r:
            by_tag.setdefault(r["predicted_cluster"], []).append(r["predicted_status"])
    parts = []
    for tag, statuses in sorted(by_tag.items()):
        others = ", ".join(f"{statuses.count(s)} {s}" for s in ("does not fit", "refused", "missing") if s in statuses)
        parts.append(f"{len(statuses)} points on {tag}" + (f" ({others})" if others else ""))
    return "predicted by ndmini plan: " + ", ".join(parts) if parts else ""


def prediction_lines(rows):
    """One line per prediction (ranks, layout, cluster: step, tokens/s, efficiency, or why none)."""
    lines = []
    for r in rows:
        status = r.get("predicted_status")
        if status is None:
            continue
        head = f"{r['ranks']:>6} ranks {r['layout']:<24} {r['predicted_cluster']}: "
        if status == "fits":
            lines.append(head + f"{r['predicted_step_ms']:.4g} ms/step, {r['predicted_tokens_per_s']:.0f} tokens/s, "
                         f"efficiency {fmt(r.get('predicted_efficiency'), '.3f')}, MFU {r['predicted_mfu']:.3f}")
        else:
            lines.append(head + status + (f": {r['predicted_message']}" if r.get("predicted_message") else ""))
    return lines


def matplotlib_hint(prog):
    """What to do when the figure is missing: install matplotlib for the python3 that ran `prog`."""
    exe = sys.executable or "python3"
    system = os.path.dirname(os.path.realpath(exe)) in ("/usr/bin", "/bin")
    fix = "apt-get install python3-matplotlib" if system else f"{exe} -m pip install matplotlib"
    return (f"(no scaling.png: matplotlib is not installed for {exe}, which ran {prog}; {fix}, then run "
            f"bench/scaling/collect.py STUDY with that python3)")


def write_outputs(study_dir):
    """results.csv, results.md and (with matplotlib) scaling.png; returns (study, rows, paths)."""
    study, rows = collect(study_dir)
    paths = [os.path.join(study_dir, "results.csv"), os.path.join(study_dir, "results.md")]
    write_csv(paths[0], rows)
    with open(paths[1], "w") as f:
        f.write(markdown(study, rows))
    png = os.path.join(study_dir, "scaling.png")
    if plot(study, rows, png):
        paths.append(png)
    return study, rows, paths


def quote(args):
    return " ".join(shlex.quote(str(a)) for a in args)
