#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The logs (docs/output.md): the progress line says "step N/M", elapsed and
# ETA, and the mean loss since the last logged step; the metrics file opens
# with a header record (version, commit, deck, every key with the degrees
# resolved, host, start time), and each step record carries the wall-clock
# time, the elapsed time and the tokens consumed.
source "$(dirname "$0")/lib.sh"
start=$(date +%s)
run 1 train tiny.toml --set train.steps=6 --set train.log_every=3 --metrics m.jsonl >out.txt 2>&1 || {
  cat out.txt
  fail "training failed"
}
end=$(date +%s)
grep '^step' out.txt
# The readers of the tests (lib.sh) still see one loss per logged step: 0, 3 and the last, 5.
[ "$(step_losses m.jsonl | cut -d' ' -f1 | tr '\n' ' ')" = "0 3 5 " ] || fail "logged steps: $(step_losses m.jsonl)"

python3 - m.jsonl out.txt "$start" "$end" <<'PY'
import json, re, sys
metrics, out, start, end = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
records = [json.loads(l) for l in open(metrics)]
def fail(msg):
    sys.exit("FAIL: " + msg)
h = records[0]
if h.get("record") != "header":
    fail(f"the first record is not the header: {str(h)[:200]}")
for key in ("version", "git_sha", "deck", "host", "start_time", "config", "ranks"):
    if not h.get(key):
        fail(f"the header has no {key}")
if h["deck"] != "tiny.toml":
    fail(f"header deck {h['deck']!r}, not the one given (tiny.toml)")
if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", h["start_time"]):
    fail(f"start_time {h['start_time']!r} is not UTC ISO 8601")
cfg = h["config"]
# Every key, the set ones, the defaults and the resolved -1 (parallel.dp_shard fills the one rank).
want = {"train.steps": 6, "train.log_every": 3, "model.seq_len": 64, "parallel.dp_shard": 1,
        "train.precision": "fp32", "checkpoint.keep": 3}
for k, v in want.items():
    if cfg.get(k) != v:
        fail(f"header config {k} = {cfg.get(k)!r}, want {v!r}")
if len(cfg) < 40:
    fail(f"header config has {len(cfg)} keys, not every key")
steps = [r for r in records if "step" in r]
if [r["step"] for r in steps] != [0, 3, 5] or not records[-1].get("summary"):
    fail("the records are not header, steps 0 3 5, summary")
tokens_per_step = cfg["train.global_batch"] * cfg["model.seq_len"]
last_elapsed = 0
for r in steps:
    if r["tokens"] != (r["step"] + 1) * tokens_per_step:
        fail(f"step {r['step']}: tokens {r['tokens']}, want {(r['step'] + 1) * tokens_per_step}")
    if not start - 1 <= r["time"] <= end + 1:
        fail(f"step {r['step']}: time {r['time']} is not between the run's start {start} and end {end}")
    if not r["elapsed_s"] > last_elapsed:
        fail(f"step {r['step']}: elapsed_s {r['elapsed_s']} does not grow")
    last_elapsed = r["elapsed_s"]
# The line's loss: the mean of the logged step's window. All six losses, from a second run logging every step.
lines = [l for l in open(out) if l.startswith("step")]
parsed = [re.match(r"step +(\d+)/(\d+) \| loss ([0-9.]+) \|.*\| elapsed ([0-9.]+ s|\d+m\d+s|\d+h\d+m) \| ETA (\S+ s|\d+m\d+s|\d+h\d+m)$", l.strip()) for l in lines]
if len(parsed) != 3 or not all(parsed):
    fail(f"progress lines not 'step N/M | loss ... | elapsed T | ETA T': {lines}")
if [(p.group(1), p.group(2)) for p in parsed] != [("0", "6"), ("3", "6"), ("5", "6")]:
    fail("not step 0/6, 3/6, 5/6")
json.dump([float(p.group(3)) for p in parsed], open("line_losses.json", "w"))
PY
# The same deck logging every step gives every step's own loss (bitwise the same training).
run 1 train tiny.toml --set train.steps=6 --set train.log_every=1 --metrics all.jsonl >all.txt 2>&1 || {
  cat all.txt
  fail "training failed"
}
python3 - all.jsonl <<'PY'
import json, sys
loss = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "step" in r]
line = json.load(open("line_losses.json"))
want = [loss[0], sum(loss[1:4]) / 3, sum(loss[4:6]) / 2]  # windows: step 0; steps 1-3; steps 4-5
for got, w, what in zip(line, want, ("step 0", "steps 1-3", "steps 4-5")):
    if abs(got - w) > 1e-6:
        sys.exit(f"FAIL: the line's loss {got} is not the mean of {what}, {w:.6f}")
print("ok: progress losses are the window means", line)
PY
# An MFU above 100% (a given peak below the run's speed) is flagged with the fix; a sane one is not.
grep -q "above 100%" out.txt && { grep -A1 "  MFU" out.txt; fail "MFU flagged above 100% with a measured peak"; }
run 1 train tiny.toml --set train.steps=3 --set perf.peak_gflops=0.001 >low.txt 2>&1 || { cat low.txt; fail "training failed"; }
grep -q "above 100%: the run multiplied faster than this peak; perf.peak_gflops = 0 measures it" low.txt ||
  { grep -A1 "  MFU" low.txt; fail "no flag for an MFU above 100%"; }
echo "ok: header, step records and progress lines; an MFU above 100% is flagged"
