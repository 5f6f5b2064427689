# SPDX-License-Identifier: BSD-3-Clause
"""A scaling study's predictions, by `ndmini plan` (docs/planner.md).

--cluster FILE predicts every point of the study on that cluster, with the
point's degrees, batch and overrides exactly as its run gets them. --predict-to N
carries the study's layout rule on to the powers of two up to N ranks, predicted
only (nothing runs), on --predict-cluster FILE (default: the --cluster one; a
different cluster's line starts at the measured rank counts too, so that its
speed-up has its own baseline). Each prediction is written as plan.json in its
point's directory (points/<label>/, or predicted/<cluster>/<label>/ for the
extension) and the cluster files are copied into clusters/, so the collector
needs neither the binary nor the files afterwards.

A plan.json holds: cluster_file, command, ok, message (why the batch rule or the
planner refused the point) and plan (`ndmini plan --json`'s document when ok).
"""

import json
import os
import shutil
import subprocess

import study as st

PLAN_TIMEOUT_S = 120


def check_options(cluster, predict_cluster, predict_to, layout_rule):
    """Refuses a combination of the prediction options before anything is written."""
    if predict_to is not None and not cluster:
        raise st.StudyError("--predict-to needs --cluster FILE: the cluster the predictions are made for (for runs "
                            "on this machine inputs/clusters/here.toml)")
    if predict_cluster and predict_to is None:
        raise st.StudyError("--predict-cluster FILE is the cluster of the --predict-to extension; give --predict-to N "
                            "too (or only --cluster FILE to predict the measured points)")
    for flag, path in (("--cluster", cluster), ("--predict-cluster", predict_cluster)):
        if path:
            st.check_input_file(flag, path, "a cluster file such as inputs/clusters/here.toml (this machine) or "
                                "inputs/clusters/h100.toml")
    if predict_to is not None:
        if not 2 <= predict_to <= st.MAX_WORLD:
            raise st.StudyError(f"--predict-to {predict_to}: give the largest rank count to predict, from 2 to "
                                f"{st.MAX_WORLD} (the largest world ndmini plans)")
        if layout_rule == "explicit":
            raise st.StudyError("--predict-to carries a --layout rule on to more ranks, and a study of --point "
                                "layouts has no rule: give --ranks with --layout, or give the larger layouts as "
                                "--point too (--emit-sbatch plans them without running, --cluster predicts them)")


def extension_ranks(measured_ranks, predict_to, with_measured):
    """The powers of two above the measured rank counts, up to predict_to (and the measured
    counts themselves where the extension is on another cluster)."""
    top = max(measured_ranks)
    powers = [1 << k for k in range(predict_to.bit_length()) if top < 1 << k <= predict_to]
    if not powers:
        raise st.StudyError(f"--predict-to {predict_to}: no power of two above the study's largest rank count {top} "
                            f"and up to {predict_to}; give at least {1 << top.bit_length()}")
    return sorted(set(measured_ranks) | set(powers)) if with_measured else powers


def plan_point(exe, deck, cluster, point):
    """What `ndmini plan` says of one point: a plan.json record. A refusal of the
    point (its layout or batch) is recorded; a bad cluster file stops the study."""
    cmd = [exe, "plan", deck, "--cluster", cluster, "--world", str(point["ranks"]), "--json"]
    for o in point["overrides"]:
        cmd += ["--set", o]
    record = {"cluster_file": cluster, "command": st.quote(cmd)}
    if point.get("precheck_error"):  # the study's batch rule refused it: nothing to plan
        return {**record, "command": "", "ok": False, "message": point["precheck_error"]}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=PLAN_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise st.StudyError(f"could not run '{exe} plan' ({e}); build ndmini (cmake --build build --target "
                            f"ndmini_exe) or pass --exe") from None
    if out.returncode == 0:
        try:
            return {**record, "ok": True, "message": "", "plan": json.loads(out.stdout)}
        except json.JSONDecodeError:
            raise st.StudyError(f"'{st.quote(cmd)}' printed no JSON document; is {exe} an ndmini with `plan`?") \
                from None
    errors = [line.split("ndmini: error:", 1)[1].strip() for line in (out.stderr + out.stdout).splitlines()
              if "ndmini: error:" in line]
    if not errors:
        tail = " | ".join(line for line in (out.stderr + out.stdout).splitlines() if line.strip())[-300:]
        raise st.StudyError(f"'{exe} plan' exited {out.returncode} without a message from ndmini: {tail}")
    if f"cluster file '{cluster}'" in errors[-1]:  # the same for every point: one message, no study
        raise st.StudyError(errors[-1])
    return {**record, "ok": False, "message": errors[-1]}


def cluster_info(path, tag):
    """The study's record of a cluster file: where it is, its name, per-node devices, memory."""
    with open(path) as f:
        text = f.read()
    return {"tag": tag, "file": path, "copy": os.path.join("clusters", tag + ".toml"),
            "sha256": st.sha256_file(path), "name": st.deck_value(text, None, "name") or tag,
            "per_node": st.deck_value(text, "device", "per_node"),
            "memory_gib": st.deck_value(text, "device", "memory_gib")}


def placement_notes(points, cluster):
    """Where the runs place their ranks on nodes otherwise than the cluster file does: the
    planner takes the file's devices per node, so an axis' link may differ from the run's."""
    per_node = int(cluster["per_node"] or 1)
    return [f"{p['label']} runs {p['ranks_per_node']} ranks per node, {cluster['tag']} has {per_node} devices per "
            f"node: the prediction places them by the cluster file (which link an axis uses: docs/planner.md)"
            for p in points if min(p["ranks_per_node"], p["ranks"]) != min(per_node, p["ranks"])]


def cluster_tag(path):
    return os.path.splitext(os.path.basename(path))[0]


def predict(study, study_dir, deck, cluster, predict_cluster=None, predict_to=None):
    """Plans every point of a study (and the --predict-to extension) with `ndmini plan`.

    Sets study['prediction'] (the clusters, how far the rule is carried, the rank counts it
    cannot split) and study['predicted_points']; returns {point dir: plan.json record}
    for write_predictions. Nothing is written here, so a bad cluster file leaves no study.
    """
    study.pop("prediction", None)
    study["predicted_points"] = []
    if not cluster:
        return {}
    exe = study["exe"]
    if not os.path.exists(exe):
        raise st.StudyError(f"{exe}: no ndmini executable to predict with (`ndmini plan`); build it or pass --exe")
    if "deck_micro_batch" not in study:  # a study planned before predictions: the deck's micro-batch
        with open(deck) as f:
            study["deck_micro_batch"] = int(st.overridden(study["overrides"], "train", "micro_batch") or
                                            st.deck_value(f.read(), "train", "micro_batch") or 4)
    cluster = os.path.abspath(cluster)
    extension = os.path.abspath(predict_cluster or cluster)
    same = os.path.realpath(extension) == os.path.realpath(cluster)
    tag, extension_tag = cluster_tag(cluster), cluster_tag(extension)
    if not same and extension_tag == tag:
        extension_tag += "-2"
    clusters = {tag: cluster_info(cluster, tag)}
    records = {os.path.join(study_dir, "points", p["label"]): plan_point(exe, deck, cluster, p)
               for p in study["points"]}
    skipped = []
    if predict_to:
        clusters[extension_tag] = cluster_info(extension, extension_tag)
        per_node = int(clusters[extension_tag]["per_node"] or 1)
        base = os.path.join(study_dir, "predicted", extension_tag)
        for n in extension_ranks([p["ranks"] for p in study["points"]], predict_to, with_measured=not same):
            try:
                degrees = st.layout_degrees(study["layout_rule"], n)
            except st.StudyError as e:  # the rule cannot split n ranks (a fixed degree that does not divide it)
                skipped.append(f"{n} ranks: {e}")
                continue
            point = {**st.make_point(study, n, degrees, base, per_node, 1), "cluster": extension_tag}
            study["predicted_points"].append(point)
            records[point["dir"]] = plan_point(exe, deck, extension, point)
    study["prediction"] = {"clusters": clusters, "measured_cluster": tag,
                           "extension_cluster": extension_tag if predict_to else None, "predict_to": predict_to,
                           "skipped": skipped, "notes": placement_notes(study["points"], clusters[tag])}
    return records


def write_predictions(study, study_dir, records):
    """plan.json beside each point and copies of the cluster files; an earlier extension is replaced."""
    shutil.rmtree(os.path.join(study_dir, "predicted"), ignore_errors=True)
    if not study.get("prediction"):
        return
    for info in study["prediction"]["clusters"].values():
        os.makedirs(os.path.join(study_dir, "clusters"), exist_ok=True)
        shutil.copyfile(info["file"], os.path.join(study_dir, info["copy"]))
    for pdir, record in records.items():
        os.makedirs(pdir, exist_ok=True)
        with open(os.path.join(pdir, "plan.json"), "w") as f:
            json.dump(record, f, indent=2)
