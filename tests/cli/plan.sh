#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# ndmini plan end to end (the case name is $1): the shipped cluster files
# read, a layout evaluated and a search ranked (table and JSON), and each
# bad input refused with one `ndmini: error:` line naming the key or file,
# exit status 2; and `ndmini train` with perf.cluster printing the planner's
# prediction of its own layout beside what it measures.
source "$(dirname "$0")/lib.sh"

A100="$SOURCE_DIR/inputs/clusters/dgx-a100-80gb.toml"

# expect_exit2 SUBSTRING ARGS...: ndmini plan exits 2 with one error line holding SUBSTRING.
expect_exit2() {
  local want=$1
  shift
  local rc=0
  run 1 plan "$@" >out.txt 2>&1 || rc=$?
  cat out.txt
  [ "$rc" -eq 2 ] || fail "expected exit status 2, got $rc for: ndmini plan $*"
  [ "$(grep -c . out.txt)" -eq 1 ] || fail "expected one line of output for: ndmini plan $*"
  grep -q "^ndmini: error: " out.txt || fail "the message does not begin with 'ndmini: error:'"
  grep -qF -- "$want" out.txt || fail "expected the message to contain: $want"
  echo "ok: exit 2 with '$want'"
}

# A copy of the A100 file with one line changed (sed expression $1).
cluster_with() { sed -E "$1" "$A100" >bad.toml; }

case "$1" in
  clusters)
    for f in "$SOURCE_DIR"/inputs/clusters/*.toml; do
      run 1 plan tiny.toml --cluster "$f" --world 1 >out.txt 2>&1 || { cat out.txt; fail "$f was refused"; }
      grep -q "fits" out.txt || fail "no memory line for $f"
      echo "ok: $f"
    done ;;
  evaluate)
    # The deck's layout exactly: its degrees, memory, FLOPs, traffic and times.
    run 1 plan tiny.toml --cluster "$A100" --world 4 --set parallel.tp=2 --set parallel.pp=2 \
      --set model.layers=4 >out.txt 2>&1 || { cat out.txt; fail "evaluation refused"; }
    cat out.txt
    grep -qF "pp=2 dp_replicate=1 dp_shard=1 cp=1 tp=2" out.txt || fail "not the deck's layout"
    for word in "memory per device" "FLOPs per step" "time per step" "MFU" " tp " " pp " "tied_wte"; do
      grep -qF -- "$word" out.txt || fail "the report lacks '$word'"
    done ;;
  search_json)
    # Degrees 0: every layout of 8 devices, ranked; JSON with the documented keys, fastest first.
    run 1 plan tiny.toml --cluster "$A100" --world 8 --top 5 --json --set parallel.pp=0 --set parallel.dp_replicate=0 \
      --set parallel.dp_shard=0 --set parallel.cp=0 --set parallel.tp=0 >out.json 2>err.txt || { cat err.txt; fail "search refused"; }
    python3 - out.json <<'PY' || fail "the JSON is not what docs/planner.md says"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["search"] is True and doc["world"] == 8 and doc["fitting"] > 1, doc
layouts = doc["layouts"]
assert len(layouts) == 5
steps = [l["time_ms"]["step"] for l in layouts]
assert steps == sorted(steps), steps
for l in layouts:
    d = l["layout"]
    assert d["pp"] * d["dp_replicate"] * d["dp_shard"] * d["cp"] * d["tp"] == 8, d
    m = l["memory_bytes"]
    assert m["total"] == sum(m[k] for k in ("params", "grads", "optimizer", "activations", "comm_buffers", "workspace"))
    t = l["time_ms"]
    parts = sum(t[k] for k in ("compute", "recompute", "kernels", "exposed_comm", "bubble", "optimizer"))
    assert abs(parts - t["step"]) <= 1e-9 * t["step"] + 1e-12, t
    assert 0 < l["mfu"] <= 1 and l["tokens_per_s"] > 0 and l["fits"]
    assert {c["group"] for c in l["comm"]} >= {"dp_replicate", "fsdp", "tp", "cp", "pp", "batch", "norm"}
print("json ok")
PY
    # --search does the same whatever the deck's degrees.
    run 1 plan tiny.toml --cluster "$A100" --world 8 --search >out.txt 2>&1 || { cat out.txt; fail "--search refused"; }
    grep -qE "^ +1 " out.txt || fail "no ranked table" ;;
  moe)
    # A Mixture-of-Experts deck: ep searched; the MoE block's all-to-alls, experts and state per rank.
    H100="$SOURCE_DIR/inputs/clusters/h100.toml"
    run 1 plan "$SOURCE_DIR/inputs/moe-small.toml" --cluster "$H100" --world 8 --search --top 40 \
      --set train.global_batch=8 --set train.micro_batch=1 >out.txt 2>&1 || { cat out.txt; fail "MoE search refused"; }
    cat out.txt
    for ep in 1 2 4 8; do grep -qE "^ +[0-9]+ .* ep=$ep\$" out.txt || fail "no ranked layout with ep=$ep"; done
    grep -qE "^moe +[0-9] MoE blocks on that stage" out.txt || fail "no MoE line"
    # Megatron-LM's MoE layer: one block of 8 experts of 14336 over ep 8 on 8 H100, 4096 rows per rank.
    printf '[model]\nlayers = 1\nchannels = 4096\nheads = 32\nvocab = 32000\nseq_len = 4096\nbias = false\n'\
'moe_experts = 8\nmoe_top_k = 2\nmoe_hidden = 14336\n[train]\nglobal_batch = 8\nmicro_batch = 1\n'\
'[parallel]\ndp_shard = 8\nep = 8\n' >moe.toml
    for imbalance in 1 2; do
      run 1 plan moe.toml --cluster "$H100" --world 8 --precision bf16 --json --set perf.moe_imbalance=$imbalance \
        >moe$imbalance.json 2>err.txt || { cat err.txt; fail "the MoE layer was refused"; }
    done
    python3 - moe1.json moe2.json <<'PY' || fail "the MoE block's cost is not what docs/planner.md says"
import json, sys
one, two = (json.load(open(f))["layouts"][0] for f in sys.argv[1:3])
m, m2 = one["moe"], two["moe"]
assert one["layout"]["ep"] == 8 and m["blocks"] == 1 and m["experts_per_rank"] == 1 and m["expert_fsdp"] == 1, m
assert m["all_to_all_bytes"] == 4096 * 2 * 4096 * 2, m  # rows x k x C x bf16
assert not m["all_to_all_inter_node"], m
# 7/8 of the bytes leave the rank at 450 x 0.8 GB/s, plus 3 us.
assert abs(m["all_to_all_ms"] - (m["all_to_all_bytes"] * 7 / 8 / 360e6 + 3e-3)) < 1e-9, m
# The experts' two products over 8192 rows at 0.6 of 989 TFLOP/s.
assert abs(m["experts_ms"] - 2 * 2 * 8192 * 4096 * 14336 / (0.6 * 989e9)) < 1e-9, m
assert abs(m["forward_ms"] - (m["router_ms"] + m["experts_ms"] + m["permute_ms"] + 2 * m["all_to_all_ms"])) < 1e-9
# Twice the imbalance: twice the experts' time, the all-to-all unchanged.
assert abs(m2["experts_ms"] - 2 * m["experts_ms"]) < 1e-9 and m2["all_to_all_ms"] == m["all_to_all_ms"], (m, m2)
ep = [c for c in one["comm"] if c["group"] == "ep"]
assert len(ep) == 1 and ep[0]["calls"] == 4 and ep[0]["exposed_ms"] == ep[0]["ms"], ep
print("moe ok")
PY
    ;;
  missing_key)
    cluster_with '/^peak_tflops_bf16/d'
    expect_exit2 "cluster file 'bad.toml': missing key device.peak_tflops_bf16" tiny.toml --cluster bad.toml --world 1 ;;
  impossible_value)
    cluster_with 's/^bandwidth_gbs = 25 /bandwidth_gbs = -25 /'
    expect_exit2 "inter_node.bandwidth_gbs = -25 is impossible" tiny.toml --cluster bad.toml --world 1 ;;
  fractional_devices)
    cluster_with 's/^per_node = 8 /per_node = 7.5 /'
    expect_exit2 "device.per_node = 7.5 must be a whole number" tiny.toml --cluster bad.toml --world 1 ;;
  optional_keys)
    # The optional refinements: an overlap of 0 is a fraction like any other, 1.5 is not.
    cluster_with '$ a [efficiency]\noverlap = 0\nattention = 0.5'
    run 1 plan tiny.toml --cluster bad.toml --world 2 --set parallel.dp_replicate=2 --json >out.json 2>&1 ||
      { cat out.json; fail "overlap = 0 was refused"; }
    python3 - out.json <<'PY' || fail "overlap = 0 did not expose the data-parallel reduction whole"
import json, sys
comm = {c["group"]: c for c in json.load(open(sys.argv[1]))["layouts"][0]["comm"]}
dp = comm["dp_replicate"]
assert dp["ms"] > 0 and abs(dp["exposed_ms"] - dp["ms"]) <= 1e-12 * dp["ms"], dp
PY
    cluster_with '$ a [efficiency]\noverlap = 1.5'
    expect_exit2 "efficiency.overlap = 1.5 is impossible" tiny.toml --cluster bad.toml --world 1
    cluster_with 's/^(memory_bandwidth_gbs = .*)$/\1\nkernel_bandwidth_gbs = 0/'
    expect_exit2 "device.kernel_bandwidth_gbs = 0 is impossible" tiny.toml --cluster bad.toml --world 1 ;;
  gemm_classes)
    # The shape classes (a product's smallest dimension: < 128 small, < 384 medium, else large) each
    # with its own efficiency per precision; an absent class takes efficiency.compute (0.6 here).
    # plan_step NAME FILE ARGS...: the predicted step and compute of one layout, into NAME.json.
    plan_step() {
      local name=$1 file=$2
      shift 2
      run 1 plan --cluster "$file" --world 1 --json "$@" >"$name.json" 2>err.txt || { cat err.txt; fail "$name refused"; }
    }
    tiny=(tiny.toml)                                                  # 64 channels: every product small
    large=("$SOURCE_DIR/inputs/gpt2-124m.toml" --set train.micro_batch=4 --set model.layers=2)  # 1024 rows, 768 wide: all large
    medium=("$SOURCE_DIR/inputs/gpt2-124m.toml" --set train.micro_batch=1 --set model.layers=2) # 256 rows: all medium
    for what in tiny large medium; do
      declare -n deck=$what
      plan_step "$what" "$A100" "${deck[@]}"
      plan_step "$what-bf16" "$A100" "${deck[@]}" --precision bf16
      for key in gemm_small_fp32 gemm_medium_fp32 gemm_large_fp32 gemm_small_bf16; do
        cluster_with "\$ a [efficiency]\n$key = 0.3"
        plan_step "$what-$key" bad.toml "${deck[@]}"
        plan_step "$what-$key-bf16" bad.toml "${deck[@]}" --precision bf16
      done
      # Every class at efficiency.compute's value: the same as no class at all.
      cluster_with '$ a [efficiency]\ngemm_small_fp32 = 0.6\ngemm_medium_fp32 = 0.6\ngemm_large_fp32 = 0.6'
      plan_step "$what-same" bad.toml "${deck[@]}"
    done
    python3 - <<'PY' || fail "a shape class's efficiency did not move exactly the layouts of its class"
import json
def step(name):
    return json.load(open(name + ".json"))["layouts"][0]["time_ms"]
same = lambda a, b: abs(a - b) <= 1e-12 * max(a, b)
for what, cls in (("tiny", "small"), ("large", "large"), ("medium", "medium")):
    base, base16 = step(what), step(what + "-bf16")
    assert same(step(what + "-same")["step"], base["step"]), (what, "classes at efficiency.compute moved it")
    for key in ("gemm_small_fp32", "gemm_medium_fp32", "gemm_large_fp32", "gemm_small_bf16"):
        fp32, bf16 = step(what + "-" + key), step(what + "-" + key + "-bf16")
        mine = key.startswith("gemm_" + cls + "_")
        precision_fp32 = key.endswith("fp32")
        # Halving the efficiency of this deck's class in this precision slows its products; any other key leaves it.
        for t, b, own in ((fp32, base, mine and precision_fp32), (bf16, base16, mine and not precision_fp32)):
            if own:
                assert t["compute"] > 1.3 * b["compute"] and t["step"] > b["step"], (what, key, t, b)
                assert same(t["kernels"], b["kernels"]) and same(t["optimizer"], b["optimizer"]), (what, key)
            else:
                assert same(t["step"], b["step"]), (what, key, t["step"], b["step"])
        print(what, key, "fp32 %.4g -> %.4g ms, bf16 %.4g -> %.4g ms" % (base["step"], fp32["step"], base16["step"], bf16["step"]))
PY
    ;;
  gemm_bad_values)
    for bad in "gemm_small_fp32 = 0" "gemm_large_bf16 = 1.5" "gemm_medium_fp32 = -0.2"; do
      cluster_with "\$ a [efficiency]\n$bad"
      expect_exit2 "efficiency.${bad% =*} = ${bad#*= } is impossible: must be a fraction of the precision's peak" \
        tiny.toml --cluster bad.toml --world 1
    done
    cluster_with '$ a [efficiency]\ngemm_medium_bf16 = "fast"'
    expect_exit2 "efficiency.gemm_medium_bf16 must be a number" tiny.toml --cluster bad.toml --world 1
    cluster_with '$ a [efficiency]\ngemm_tiny_fp32 = 0.5'
    expect_exit2 "unknown key 'efficiency.gemm_tiny_fp32'" tiny.toml --cluster bad.toml --world 1 ;;
  other_code)
    # --stored-attention-scores and --pp-scatter-gather time another code's run (docs/planner.md):
    # each adds exactly its documented bytes, and nothing else moves. gpt2-124m cut to 4 layers at
    # tp 2 x pp 2, 4 micro-batches of one 256-token sequence, fp32: a stage holds 2 layers.
    deck=("$SOURCE_DIR/inputs/gpt2-124m.toml" --set model.layers=4 --set train.micro_batch=1
          --set parallel.tp=2 --set parallel.pp=2)
    for flags in "" "--stored-attention-scores" "--pp-scatter-gather" "--set parallel.sequence_parallel=true" \
                 "--set parallel.sequence_parallel=true --pp-scatter-gather"; do
      # shellcheck disable=SC2086
      run 1 plan "${deck[@]}" --cluster "$A100" --world 4 --json $flags >"out${flags// /}.json" 2>err.txt ||
        { cat err.txt; fail "refused: $flags"; }
    done
    run 1 plan "${deck[@]}" --cluster "$A100" --world 4 --stored-attention-scores --pp-scatter-gather >out.txt 2>&1 ||
      { cat out.txt; fail "the table was refused"; }
    grep -qF "times of a code that is not ndmini: attention stores its s x s scores; pipeline transfers scattered" \
      out.txt || fail "the report does not say it times another code"
    python3 - <<'PY' || fail "a flag for another code did not add exactly its bytes"
import json
def doc(name):
    return json.load(open("out" + name + ".json"))
def layout(name):
    return doc(name)["layouts"][0]
same = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-30)
base, scores, sg = layout(""), layout("--stored-attention-scores"), layout("--pp-scatter-gather")
sp, sp_sg = layout("--setparallel.sequence_parallel=true"), layout("--setparallel.sequence_parallel=true--pp-scatter-gather")
assert doc("")["implementation"] == {"stored_attention_scores": False, "pp_scatter_gather": False}
assert doc("--stored-attention-scores")["implementation"]["stored_attention_scores"] is True
# Stored scores: per layer and micro-batch, heads/tp x T x T score elements, each moving 6e + 1 bytes
# in the forward and 9e + 1 in the backward (e = 4: fp32), at the A100 file's 2039 GB/s.
B, heads, T, tp, layers, micro_batches, e = 1, 12, 256, 2, 2, 4, 4
added_ms = micro_batches * ((6 * e + 1) + (9 * e + 1)) * B * heads / tp * T * T * layers / 2039e6
t0, t1 = base["time_ms"], scores["time_ms"]
assert base["stage"] == scores["stage"], (base["stage"], scores["stage"])
assert same(t1["kernels"] - t0["kernels"], added_ms), (t1["kernels"] - t0["kernels"], added_ms)
for part in ("compute", "recompute", "exposed_comm", "optimizer"):
    assert same(t1[part], t0[part]), part
assert scores["memory_bytes"] == base["memory_bytes"], "the memory is ndmini's own either way"
# Scatter/gather without SP: each pipeline transfer is 1/tp; each receive adds a tp all-gather of the
# whole activation (T x 768 fp32 values).
comm = lambda l: {c["group"]: c for c in l["comm"]}
c0, c1 = comm(base), comm(sg)
assert same(c1["pp"]["bytes"], c0["pp"]["bytes"] / tp) and c1["pp"]["calls"] == c0["pp"]["calls"], (c0["pp"], c1["pp"])
receives = c0["pp"]["calls"] // 2
assert c1["tp"]["calls"] == c0["tp"]["calls"] + receives, (c0["tp"], c1["tp"])
assert same(c1["tp"]["bytes"] - c0["tp"]["bytes"], receives * T * 768 * 4), (c0["tp"], c1["tp"])
for g in c0:
    if g not in ("pp", "tp"):
        assert c1[g] == c0[g], g
# With SP ndmini already sends 1/tp: the flag changes nothing.
assert comm(sp_sg) == comm(sp) and sp_sg["time_ms"] == sp["time_ms"]
print("stored scores +%.4f ms; pp bytes %.0f -> %.0f" % (added_ms, c0["pp"]["bytes"], c1["pp"]["bytes"]))
PY
    ;;
  collective_kinds)
    # A collective kind with its own key (--calibrate writes them: MPI's reduce-scatter is slower
    # than its all-reduce on this project's machines) takes its bus bandwidth from it, any other the
    # all-reduce's. With the latencies 0 a collective's time is its bytes over that bandwidth:
    # halving one kind's doubles exactly the groups that send that kind and leaves the others.
    # fsdp 2 x cp 2 (one stage, so the report's stage stays the same): FSDP's all-gathers and
    # reduce-scatters over both axes, cp's ring exchange, the loss's all-reduce; all inside the node.
    plan_comm() {
      run 1 plan tiny.toml --cluster "$1" --world 4 --set parallel.dp_shard=2 --set parallel.cp=2 --json >"$1.json" \
        2>err.txt || { cat err.txt; fail "$1 was refused"; }
    }
    no_latency='s/^latency_us = [0-9]+ /latency_us = 0 /'
    cluster_with "$no_latency" && mv bad.toml base.toml
    cluster_with "$no_latency; s/^(bandwidth_gbs = 300 .*)$/\1\nall_gather_gbs = 300\nreduce_scatter_gbs = 300\np2p_gbs = 300/"
    mv bad.toml same.toml
    cluster_with "$no_latency; s/^(bandwidth_gbs = 300 .*)$/\1\nall_gather_gbs = 150\nreduce_scatter_gbs = 150/"
    mv bad.toml gathers.toml
    cluster_with "$no_latency; s/^(bandwidth_gbs = 300 .*)$/\1\np2p_gbs = 150/" && mv bad.toml p2p.toml
    for f in base same gathers p2p; do plan_comm $f.toml; done
    python3 - <<'PY' || fail "a collective kind's own bandwidth was not the one used"
import json
comm = lambda f: {c["group"]: c["ms"] for c in json.load(open(f + ".toml.json"))["layouts"][0]["comm"]}
base, same, gathers, p2p = comm("base"), comm("same"), comm("gathers"), comm("p2p")
assert same == base, (same, base)
assert base["fsdp"] > 0 and base["cp"] > 0 and base["batch"] > 0, base
close = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b))
for changed, group in ((gathers, "fsdp"), (p2p, "cp")):
    for g in base:
        assert close(changed[g], 2 * base[g] if g == group else base[g]), (group, g, changed[g], base[g])
print("fsdp %.4f -> %.4f ms, cp %.4f -> %.4f ms" % (base["fsdp"], gathers["fsdp"], base["cp"], p2p["cp"]))
PY
    cluster_with 's/^(bandwidth_gbs = 25 .*)$/\1\nreduce_scatter_gbs = 0/'
    expect_exit2 "inter_node.reduce_scatter_gbs = 0 is impossible" tiny.toml --cluster bad.toml --world 1 ;;
  unknown_key)
    cluster_with 's/^latency_us = 8 /latncy_us = 8 /'
    expect_exit2 "unknown key 'inter_node.latncy_us'" tiny.toml --cluster bad.toml --world 1 ;;
  missing_cluster_file)
    expect_exit2 "cluster file 'nowhere.toml' does not exist" tiny.toml --cluster nowhere.toml --world 1 ;;
  no_cluster)
    expect_exit2 "ndmini plan needs --cluster FILE" tiny.toml --world 1 ;;
  no_layout_divides)
    # 7 devices: 7 divides neither the batch (8), the heads (4), 2 x seq_len (64) nor the 2 layers.
    expect_exit2 "--world 7: no layout of 7 devices divides the deck" tiny.toml --cluster "$A100" --world 7 --search ;;
  none_fits)
    cluster_with 's/^memory_gib = 80 /memory_gib = 0.0001 /'
    expect_exit2 "fits device.memory_gib = 0.0001 of cluster file 'bad.toml'" tiny.toml --cluster bad.toml --world 2 --search ;;
  layout_does_not_split)
    # The deck's own layout: tp = 3 does not divide the 4 heads.
    expect_exit2 "model.heads = 4 is not divisible by parallel.tp = 3" tiny.toml --cluster "$A100" --world 3 \
      --set parallel.tp=3 ;;
  planned)
    # What was planned and why: the batch in the header and the JSON, the notes (the batch caps dp,
    # fp32 on a GPU, launches untimed), the table's compute + comm + bubble = step, equal times
    # ordered by memory, sp off at tp = 1, and the in-flight count outside memory_bytes.
    H100="$SOURCE_DIR/inputs/clusters/h100.toml"
    run 1 plan tiny.toml --cluster "$H100" --world 16 --search --top 40 >out.txt 2>&1 || { cat out.txt; fail "search refused"; }
    head -6 out.txt
    grep -qF "global batch 8 sequences of 64 tokens, micro-batch searched, fp32 compute" out.txt || fail "no batch line"
    grep -qF "note: train.global_batch = 8 caps the data-parallel degree at 8 of the 16 devices" out.txt ||
      fail "no note that the batch caps dp"
    grep -qF "is planned as fp32 on this cluster's devices (67 TFLOP/s fp32 against 989 bf16)" out.txt ||
      fail "no note on fp32 on a GPU"
    grep -qF "note: the model leaves kernel launches out" out.txt || fail "no note on launches"
    awk '/^ +[0-9]+ +[0-9]+ /{ s = $15 + $16 + $17; if (s < $14 - 0.002 || s > $14 + 0.002) bad = bad " " $1; n++ }
         END { exit bad != "" || n < 40 }' out.txt || fail "compute + comm + bubble is not the step in the table"
    run 1 plan tiny.toml --cluster "$H100" --world 16 --search --top 200 --json >out.json 2>err.txt ||
      { cat err.txt; fail "search refused (JSON)"; }
    python3 - out.json <<'PY' || fail "the JSON does not say what was planned"
import json, sys
doc = json.load(open(sys.argv[1]))
assert (doc["global_batch"], doc["micro_batch"], doc["seq_len"], doc["precision"]) == (8, 4, 64, "fp32"), doc
assert any("caps the data-parallel degree" in n for n in doc["notes"]), doc["notes"]
layouts = doc["layouts"]
ties = 0
for a, b in zip(layouts, layouts[1:]):
    ta, tb = a["time_ms"]["step"], b["time_ms"]["step"]
    assert ta <= tb
    if ta == tb:
        ties += 1
        assert a["memory_bytes"]["total"] <= b["memory_bytes"]["total"], (a["layout"], b["layout"])
assert ties > 0, "no equal times among the layouts: the order by memory is untested"
for l in layouts:
    assert "in_flight" not in l["memory_bytes"] and l["micro_batches_in_flight"] >= 1, l["memory_bytes"]
    assert l["kernel_launches"] > 0 and l["time_ms"]["launch"] == 0
    if l["layout"]["tp"] == 1:
        assert l["layout"]["sequence_parallel"] is False, l["layout"]
print("json ok,", ties, "ties")
PY
    # sp at tp = 1 has no effect: off. bf16 on the cluster: no fp32 note.
    run 1 plan tiny.toml --cluster "$H100" --world 1 --set parallel.sequence_parallel=true --precision bf16 \
      >out.txt 2>&1 || { cat out.txt; fail "evaluation refused"; }
    grep -qF "sp=off" out.txt || fail "sequence parallelism shown on at tp = 1"
    ! grep -qF "is planned as fp32" out.txt || fail "an fp32 note under --precision bf16" ;;
  deck_keys)
    # --precision bf16 is train.precision (so comm.reduce_dtype = "bf16" is accepted); the deck's
    # perf.memory_per_rank_gib bounds the plan; the deck's degrees against --world: plan's advice.
    run 1 plan tiny.toml --cluster "$A100" --world 2 --set parallel.dp_replicate=2 --set comm.reduce_dtype=bf16 \
      --precision bf16 >out.txt 2>&1 || { cat out.txt; fail "--precision bf16 was not taken as train.precision"; }
    grep -qF "bf16 compute" out.txt || fail "not planned in bf16"
    run 1 plan tiny.toml --cluster "$A100" --world 1 --set perf.memory_per_rank_gib=2 >out.txt 2>&1 ||
      { cat out.txt; fail "perf.memory_per_rank_gib = 2 refused"; }
    grep -qF "memory per device 0.01 GiB of 2.00 GiB" out.txt || fail "perf.memory_per_rank_gib not honoured"
    grep -qF "note: perf.memory_per_rank_gib = 2 of the deck limits memory per device" out.txt || fail "no note"
    expect_exit2 "fits the deck's perf.memory_per_rank_gib = 0.0001" tiny.toml --cluster "$A100" --world 2 --search \
      --set perf.memory_per_rank_gib=0.0001
    # Every degree set (dp_shard = -1, the default, would fill the world): they make 1 device, not 2.
    expect_exit2 "make 1 device; set them with --set parallel.<axis>=N to make 2, or add --search" tiny.toml \
      --cluster "$A100" --world 2 --set parallel.dp_shard=1
    ! grep -qF "launch" out.txt || fail "plan gives train's advice" ;;
  launches)
    # device.launch_overhead_us: each launch costs it, in the step; 0 is a value; -1 is refused.
    cluster_with 's/^(memory_bandwidth_gbs = .*)$/\1\nlaunch_overhead_us = 4/'
    run 1 plan tiny.toml --cluster bad.toml --world 1 --json >with.json 2>&1 || { cat with.json; fail "refused"; }
    run 1 plan tiny.toml --cluster "$A100" --world 1 --json >without.json 2>&1 || { cat without.json; fail "refused"; }
    python3 - with.json without.json <<'PY' || fail "the launches are not in the step"
import json, sys
a, b = (json.load(open(f))["layouts"][0] for f in sys.argv[1:])
assert a["kernel_launches"] == b["kernel_launches"] > 0
assert abs(a["time_ms"]["launch"] - a["kernel_launches"] * 4e-3) < 1e-9, a["time_ms"]
assert abs(a["time_ms"]["step"] - b["time_ms"]["step"] - a["time_ms"]["launch"]) < 1e-9
parts = sum(a["time_ms"][k] for k in ("compute", "recompute", "kernels", "launch", "exposed_comm", "bubble", "optimizer"))
assert abs(parts - a["time_ms"]["step"]) < 1e-9
notes = json.load(open(sys.argv[1]))["notes"]
assert not any("kernel launches out" in n for n in notes), notes
print("launches ok:", a["kernel_launches"], "launches,", a["time_ms"]["launch"], "ms")
PY
    cluster_with 's/^(memory_bandwidth_gbs = .*)$/\1\nlaunch_overhead_us = -1/'
    expect_exit2 "device.launch_overhead_us = -1 is impossible" tiny.toml --cluster bad.toml --world 1 ;;
  fit_missing_key)
    # A summary without a key --fit reads: an error naming the key and the file, exit 2.
    printf '{"summary":true,"mesh":"x","compute_ms":1,"exposed_comm_ms":{},"predicted":{"cluster":"%s","products_ms":1,"step_ms":1,"kernels_ms":0,"optimizer_ms":0,"exposed_comm_ms":{}}}\n' \
      "$(sed -n 's/^name = "\(.*\)"$/\1/p' "$A100")" >no_median.jsonl
    expect_exit2 "metrics file 'no_median.jsonl': its summary has no number median_step_ms" --fit no_median.jsonl \
      --cluster "$A100" ;;
  calibrate)
    # Two ranks measure this machine; the file they write reads back and plans.
    run 2 plan --calibrate --out here.toml >out.txt 2>err.txt || { cat out.txt err.txt; fail "--calibrate failed"; }
    cat here.toml err.txt
    [ ! -e here.toml.tmp ] || fail "the temporary file was left behind"
    # It says what it measures as it goes (rank 0 only), and which file it wrote.
    [ "$(grep -c '^calibrate: ' err.txt)" -ge 6 ] || fail "fewer than 6 progress lines"
    [ "$(grep -c '^calibrate: done' err.txt)" -eq 1 ] || fail "not one 'done' line (one rank speaks)"
    grep -qE '^calibrate: the GEMM peaks, fp32 and bf16 \([0-9]+ s\)$' err.txt || fail "no timed first phase"
    grep -qxF "wrote here.toml" out.txt || fail "no 'wrote here.toml'"
    grep -qE "^launch_overhead_us = [0-9.e+-]+$" here.toml || fail "no launch_overhead_us"
    run 1 plan tiny.toml --cluster here.toml --world 2 --search --top 3 >out.txt 2>&1 || { cat out.txt; fail "here.toml was refused"; }
    grep -qF "per_node = 2" here.toml || fail "two ranks on this node, but the file says otherwise"
    grep -qE "^# .*inside a node \(2 ranks [0-9.]+ GB/s, [0-9.]+ us\)" here.toml ||
      fail "the intra-node figure does not list its group size"
    for key in kernel_bandwidth_gbs attention overlap all_gather_gbs reduce_scatter_gbs p2p_gbs; do
      grep -qE "^$key = [0-9.e+-]+$" here.toml || fail "the calibration wrote no $key"
    done
    # Every shape class in both precisions, a fraction of its peak; the large fp32 class is efficiency.compute.
    python3 - here.toml <<'PY' || fail "the shape classes' efficiencies are missing or not fractions"
import re, sys
text = open(sys.argv[1]).read()
value = lambda key: float(re.search(r"^" + key + r" = ([0-9.e+-]+)$", text, re.M).group(1))
for cls in ("small", "medium", "large"):
    for precision in ("fp32", "bf16"):
        v = value("gemm_%s_%s" % (cls, precision))
        assert 0 < v <= 1, (cls, precision, v)
assert value("gemm_large_fp32") == value("compute")
print("classes ok")
PY
    # One rank has no collective to ping: refused, nothing written.
    rm here.toml
    expect_exit2 "launch at least 2" --calibrate --out here.toml
    [ ! -e here.toml ] || fail "a refused calibration wrote a file" ;;
  calibrate_loaded)
    # A loaded machine (a load average file standing in for /proc/loadavg: 64 on this node's cores):
    # with --strict refused before measuring, exit 1, nothing written, in seconds.
    echo "64.00 32.00 16.00 9/999 4242" >loadavg
    start=$(now)
    rc=0
    NDMINI_CALIBRATE_LOADAVG=loadavg run 2 plan --calibrate --strict --out here.toml >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 1 ] || fail "expected exit status 1, got $rc"
    grep -qE "^ndmini: error: plan --calibrate --strict: the machine is loaded: a 1-minute load average of 64.00 \(loadavg\)" \
      out.txt || fail "the message does not name the load and the file"
    [ "$(grep -c . out.txt)" -eq 1 ] || fail "expected one line (one rank speaks)"
    [ ! -e here.toml ] || fail "a refused calibration wrote a file"
    less_than "$(seconds_since "$start")" 20 || fail "the refusal took $(seconds_since "$start") s: it measured first"
    # A threshold that is not a number: refused, exit 2.
    NDMINI_CALIBRATE_MAX_SPREAD=lots run 2 plan --calibrate >out.txt 2>&1 && fail "a bad threshold was accepted"
    grep -qF "environment variable NDMINI_CALIBRATE_MAX_SPREAD = 'lots': must be a number" out.txt ||
      { cat out.txt; fail "the bad threshold is not named"; }
    # Passes that are not a whole number of at least 1: refused, exit 2, before measuring.
    rc=0
    NDMINI_CALIBRATE_PASSES=0.5 run 2 plan --calibrate >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || { cat out.txt; fail "passes of 0.5: expected exit status 2, got $rc"; }
    grep -qF "environment variable NDMINI_CALIBRATE_PASSES = '0.5': must be a whole number from 1 to 100" out.txt ||
      { cat out.txt; fail "the bad passes are not named"; } ;;
  calibrate_groups)
    # Four ranks on one node: the intra-node links are measured over groups of 2 and of 4 (every
    # node's groups at once) and the file takes the median of the sizes' figures. Oversubscribed
    # here: the figures mean nothing, the test checks what is measured and written; so one pass of
    # the kernels and the overlap (calibrate runs the default 3), a third of the minute they took.
    NDMINI_CALIBRATE_PASSES=1 run 4 plan --calibrate --out here.toml >out.txt 2>&1 ||
      { cat out.txt; fail "--calibrate failed"; }
    grep -qF "the model's kernels, pass 1 of 1 " out.txt || { cat out.txt; fail "not one pass of the kernels"; }
    cat here.toml
    grep -qF "per_node = 4" here.toml || fail "four ranks on this node, but the file says otherwise"
    python3 - here.toml <<'PY' || fail "the group sizes' figures or their median are wrong"
import re, sys
text = open(sys.argv[1]).read()
sizes = re.search(r"inside a node \((.*)\), every node's groups at once", text).group(1)
groups = [(int(n), float(bw), float(us)) for n, bw, us in
          re.findall(r"(\d+) ranks ([0-9.]+) GB/s, ([0-9.]+) us", sizes)]
assert [n for n, _, _ in groups] == [2, 4], groups
value = lambda section, key: float(re.search(r"\[" + section + r"\][^\[]*?^" + key + r" = ([0-9.e+-]+)$",
                                             text, re.M | re.S).group(1))
# The median of two sizes' figures is the upper one (the median of an even count); listed to 3 decimals.
bw, us = value("intra_node", "bandwidth_gbs"), value("intra_node", "latency_us")
assert abs(bw - max(g[1] for g in groups)) <= 1e-3 * max(1, bw), (bw, groups)
assert abs(us - max(g[2] for g in groups)) <= 1e-3 * max(1, us), (us, groups)
assert value("inter_node", "bandwidth_gbs") == bw and value("inter_node", "latency_us") == us, "one node"
# Each other collective kind: its own figure per group size, and their median.
for key in ("all_gather_gbs", "reduce_scatter_gbs", "p2p_gbs"):
    note = re.search(r"^# (.*)\n" + key + " = ", text, re.M).group(1)
    sizes = re.search(r"inside a node \((.*)\), every node's groups at once", note).group(1)
    kind = [(int(n), float(bw)) for n, bw in re.findall(r"(\d+) ranks ([0-9.]+) GB/s", sizes)]
    assert [n for n, _ in kind] == [2, 4], (key, kind)
    v = value("intra_node", key)
    assert abs(v - max(b for _, b in kind)) <= 1e-3 * max(1, v), (key, v, kind)
    assert value("inter_node", key) == v, ("one node", key)
print("groups", groups)
PY
    run 1 plan tiny.toml --cluster here.toml --world 4 --search --top 3 >out.txt 2>&1 ||
      { cat out.txt; fail "the 4-rank file was refused"; } ;;
  train_prediction)
    # ndmini train with perf.cluster: the banner, PERFORMANCE and the summary
    # carry the planner's prediction of the run's own layout, the same figures
    # `ndmini plan` gives for it (2 ranks on one node: within a node in both).
    layout=(--set parallel.pp=2 --set parallel.dp_replicate=1 --set train.steps=3 --set perf.peak_gflops=50)
    run 2 train tiny.toml "${layout[@]}" --set perf.cluster="$A100" --metrics m.jsonl >out.txt 2>&1 ||
      { cat out.txt; fail "train with perf.cluster failed"; }
    cat out.txt
    grep -qE "^prediction: [0-9.e+-]+ ms/step, .* on DGX A100 80GB" out.txt || fail "no prediction line in the banner"
    for part in "time/step" "compute" "exposed comm +[0-9.]+ ms  pp" "bubble +per stage"; do
      grep -qE "^ +$part.*\| predicted [0-9.e+-]+ ms" out.txt || fail "PERFORMANCE's '$part' line has no prediction"
    done
    run 1 plan tiny.toml --cluster "$A100" --world 2 --json "${layout[@]}" >plan.json 2>err.txt ||
      { cat err.txt; fail "ndmini plan refused the layout"; }
    python3 - m.jsonl plan.json <<'PY' || fail "the summary's prediction is not ndmini plan's"
import json, sys
summary = json.loads(open(sys.argv[1]).read().splitlines()[-1])
plan = json.load(open(sys.argv[2]))["layouts"][0]
p, t = summary["predicted"], plan["time_ms"]
close = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-12)
assert p["cluster_file"].endswith("dgx-a100-80gb.toml"), p
assert close(p["step_ms"], t["step"]), (p["step_ms"], t["step"])
assert close(p["compute_ms"], t["compute"] + t["recompute"] + t["kernels"] + t["optimizer"]), p
assert close(p["bubble_ms"], t["bubble"]), p
comm = {c["group"]: c["exposed_ms"] for c in plan["comm"]}
assert close(p["exposed_comm_ms"]["pp"], comm["pp"] + t["bubble"]), p  # waiting for a stage is waiting in pp
assert close(p["tokens_per_s"], plan["tokens_per_s"]) and close(p["mem_bytes"], plan["memory_bytes"]["total"]), p
# The measured side: compute and the exposed times split the step.
measured = summary["compute_ms"] + sum(summary["exposed_comm_ms"].values())
assert close(measured, summary["median_step_ms"]) or abs(measured - summary["median_step_ms"]) < 1e-9, summary
print("prediction ok:", p["step_ms"], "ms predicted,", summary["median_step_ms"], "ms measured")
PY
    # Without perf.cluster: no prediction anywhere.
    run 1 train tiny.toml --set train.steps=2 --set perf.peak_gflops=50 --metrics m1.jsonl >out.txt 2>&1 ||
      { cat out.txt; fail "train without perf.cluster failed"; }
    ! grep -q "predict" out.txt || fail "a prediction without perf.cluster"
    tail -1 m1.jsonl | grep -qF '"predicted":null' || fail "the summary's predicted is not null without perf.cluster"
    # ndmini check prints it too.
    run 1 check tiny.toml --set perf.cluster="$A100" >out.txt 2>&1 || { cat out.txt; fail "check failed"; }
    grep -q "^prediction: " out.txt || fail "ndmini check prints no prediction" ;;
  train_bad_cluster)
    # A cluster file that cannot be read stops train before anything runs, as a bad deck does
    # (exit 1 on every rank), naming the key.
    rc=0
    run 2 train tiny.toml --set parallel.dp_replicate=2 --set perf.cluster=nowhere.toml >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 1 ] || fail "expected exit status 1, got $rc"
    grep -qF "ndmini: error: perf.cluster: cluster file 'nowhere.toml' does not exist" out.txt ||
      fail "the message does not name perf.cluster and the file"
    ! grep -q "^step " out.txt || fail "a step ran with a bad perf.cluster" ;;
  fit)
    # Two runs predicted on the A100 file (far faster than this machine): the
    # fit lowers both efficiencies, and the refitted file predicts the one-rank
    # run closer to what it measured. Bad metrics files are refused, exit 2.
    common=(--set train.steps=3 --set perf.peak_gflops=50 --set perf.cluster="$A100")
    run 1 train tiny.toml "${common[@]}" --metrics one.jsonl >out.txt 2>&1 || { cat out.txt; fail "run 1 failed"; }
    run 2 train tiny.toml "${common[@]}" --set parallel.dp_replicate=2 --metrics two.jsonl >out.txt 2>&1 ||
      { cat out.txt; fail "run 2 failed"; }
    run 1 plan --fit one.jsonl two.jsonl --cluster "$A100" --out fitted.toml >fit.txt 2>&1 ||
      { cat fit.txt; fail "--fit failed"; }
    cat fit.txt
    run 1 plan tiny.toml --cluster fitted.toml --world 1 --json --set train.steps=3 >after.json 2>&1 ||
      { cat after.json; fail "the refitted file does not plan"; }
    python3 - one.jsonl after.json fit.txt <<'PY' || fail "the fit did not move the prediction towards the run"
import json, re, sys
summary = json.loads(open(sys.argv[1]).read().splitlines()[-1])
after = json.load(open(sys.argv[2]))["layouts"][0]["time_ms"]["step"]
text = open(sys.argv[3]).read()
for key in ("efficiency.compute", "efficiency.network"):
    old, new = map(float, re.search(key + r" +([0-9.e+-]+) -> ([0-9.e+-]+)", text).groups())
    assert 0 < new < old, (key, old, new)
measured, before = summary["median_step_ms"], summary["predicted"]["step_ms"]
assert abs(after - measured) < abs(before - measured), (measured, before, after)
print("fit ok: measured", measured, "ms; predicted", before, "ms before,", after, "ms after")
PY
    # A file with a shape class (tiny.toml's products are all small): the fit rescales it with
    # efficiency.compute, and the refitted file predicts the run closer.
    cluster_with '$ a [efficiency]\ngemm_small_fp32 = 0.5'
    mv bad.toml classes.toml
    run 1 train tiny.toml "${common[@]/$A100/classes.toml}" --metrics classes.jsonl >out.txt 2>&1 ||
      { cat out.txt; fail "the run on classes.toml failed"; }
    run 1 plan --fit classes.jsonl --cluster classes.toml --out refitted.toml >fit.txt 2>&1 || { cat fit.txt; fail "--fit failed"; }
    cat fit.txt
    run 1 plan tiny.toml --cluster refitted.toml --world 1 --json --set train.steps=3 >after.json 2>&1 ||
      { cat after.json; fail "the refitted file does not plan"; }
    python3 - classes.jsonl after.json fit.txt <<'PY' || fail "the fit did not rescale the shape class with the products"
import json, re, sys
text = open(sys.argv[3]).read()
ratio = {}
for key in ("efficiency.compute", "efficiency.gemm_small_fp32"):
    old, new = map(float, re.search(key + r" +([0-9.e+-]+) -> ([0-9.e+-]+)", text).groups())
    ratio[key] = new / old
assert abs(ratio["efficiency.compute"] - ratio["efficiency.gemm_small_fp32"]) < 1e-3, ratio
assert "gemm_medium_fp32" not in text, "a class the file does not have was refitted"
summary = json.loads(open(sys.argv[1]).read().splitlines()[-1])
after = json.load(open(sys.argv[2]))["layouts"][0]["time_ms"]["step"]
measured, before = summary["median_step_ms"], summary["predicted"]["step_ms"]
assert abs(after - measured) < abs(before - measured), (measured, before, after)
print("fit with a shape class ok:", ratio)
PY
    # A run without perf.cluster has nothing to fit; one predicted on another file neither.
    run 1 train tiny.toml --set train.steps=2 --set perf.peak_gflops=50 --metrics bare.jsonl >/dev/null 2>&1
    expect_exit2 "metrics file 'bare.jsonl': its run has no prediction" --fit bare.jsonl --cluster "$A100"
    expect_exit2 "not on --cluster 'fitted.toml'" --fit one.jsonl --cluster fitted.toml
    expect_exit2 "metrics file 'nowhere.jsonl' does not exist" --fit nowhere.jsonl --cluster "$A100"
    expect_exit2 "--out writes a cluster file, with --calibrate or --fit only" tiny.toml --cluster "$A100" --world 1 \
      --out x.toml
    expect_exit2 "--fit fits ndmini's own runs" --fit one.jsonl --cluster "$A100" --pp-scatter-gather ;;
  *) fail "unknown case $1" ;;
esac
