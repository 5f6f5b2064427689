#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Builds a scaling study's table from its directory: results.csv, results.md
and (with matplotlib) scaling.png. scaling.py calls the same code after its
runs; after --emit-sbatch, run this (or the study's collect.sh) once the
jobs are done. Points whose runs failed are listed as failed, points none of
whose runs started (a batch job not submitted yet) as not run, points refused
when the study was planned as refused, with their message.
Exits 1 when a point has no figures (a refused one only without --allow-missing).

The predictions made when the study was planned (scaling.py --cluster) are read
from each point's plan.json; --cluster (with --predict-to, --predict-cluster as
for scaling.py) predicts the study again with `ndmini plan` and replaces them.

  bench/scaling/collect.py runs/fsdp-weak
  bench/scaling/collect.py runs/fsdp-weak --cluster inputs/clusters/h100.toml --predict-to 1024
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import predict  # noqa: E402
import study as st  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study_dir", help="a study directory (scaling.py --out or --emit-sbatch)")
    p.add_argument("--cluster", metavar="FILE", help="predict every point again on this cluster file")
    p.add_argument("--predict-to", type=int, metavar="N",
                   help="and carry the layout rule on to the powers of two up to N ranks, predicted only")
    p.add_argument("--predict-cluster", metavar="FILE", help="the cluster of the --predict-to rows")
    p.add_argument("--exe", help="the ndmini that predicts (default: the study's)")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    study_dir = os.path.abspath(args.study_dir)
    try:
        if args.cluster or args.predict_to is not None or args.predict_cluster:
            study = st.load_study(study_dir)
            predict.check_options(args.cluster, args.predict_cluster, args.predict_to, study["layout_rule"])
            if args.exe:
                study["exe"] = os.path.abspath(args.exe)
            records = predict.predict(study, study_dir, os.path.join(study_dir, "deck.toml"), args.cluster,
                                      args.predict_cluster, args.predict_to)
            predict.write_predictions(study, study_dir, records)
            st.save_study(study, study_dir)
        study, rows, paths = st.write_outputs(study_dir)
    except st.StudyError as e:
        print(f"collect.py: error: {e}", file=sys.stderr)
        return 2
    with open(paths[1]) as f:
        print(f.read())
    code, line = st.outcome(study, rows)
    if not any(p.endswith(".png") for p in paths):
        print(st.matplotlib_hint("collect.py"), file=sys.stderr)
    print("wrote " + ", ".join(paths), file=sys.stderr)
    print(f"collect.py: {line}", file=sys.stderr)
    if st.prediction_summary(rows):
        print(f"collect.py: {st.prediction_summary(rows)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
