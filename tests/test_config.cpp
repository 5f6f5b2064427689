// SPDX-License-Identifier: BSD-3-Clause
// The input deck: values round-trip, and every mistake is refused with a
// message that names the key and says what would fix it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/effective.hpp"
#include "core/error.hpp"

using namespace ndmini;

namespace {

const char* kModel = R"(
[model]
layers = 2
channels = 12
heads = 3
vocab = 11
seq_len = 5
)";

// The error message of parse_config, or "" when it did not throw.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "deck.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expects parse_config to throw ndmini::Error with every one of `parts` in the message.
void expect_error(const std::string& text, const std::vector<std::string>& parts,
                  const std::vector<std::string>& overrides = {}) {
  const std::string msg = error_of(text, overrides);
  ASSERT_FALSE(msg.empty()) << "expected an error for:\n" << text;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

std::string with_model(const std::string& extra) { return std::string(kModel) + extra; }

}  // namespace

TEST(Config, FullDeckRoundTrips) {
  const std::string deck = with_model(R"(
[data]
source = "tokens"
path = "data/train.bin"

[train]
steps = 10
global_batch = 8
micro_batch = 2
seed = 42
lr = 1e-3
min_lr = 1e-4
warmup_steps = 3
weight_decay = 0.05
grad_clip = 0.5
log_every = 2

[parallel]
dp_replicate = 1
dp_shard = 2
tp = 1
cp = 1
pp = -1
sequence_parallel = true
schedule = "gpipe"

[checkpoint]
dir = "out"
every = 5
keep = 2
at_start = true
on_signal = false

[perf]
peak_gflops = 100.5
)");
  const Config c = parse_config(deck, "deck.toml");
  EXPECT_EQ(c.model.layers, 2);
  EXPECT_EQ(c.model.channels, 12);
  EXPECT_EQ(c.model.heads, 3);
  EXPECT_EQ(c.model.vocab, 11);
  EXPECT_EQ(c.model.seq_len, 5);
  EXPECT_EQ(c.data.source, "tokens");
  EXPECT_EQ(c.data.path, "data/train.bin");
  EXPECT_EQ(c.train.steps, 10);
  EXPECT_EQ(c.train.global_batch, 8);
  EXPECT_EQ(c.train.micro_batch, 2);
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 1e-4);
  EXPECT_EQ(c.train.warmup_steps, 3);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.05);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 0.5);
  EXPECT_EQ(c.train.log_every, 2);
  EXPECT_EQ(c.parallel.dp_replicate, 1);
  EXPECT_EQ(c.parallel.dp_shard, 2);
  EXPECT_EQ(c.parallel.pp, -1);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::gpipe);
  EXPECT_EQ(c.checkpoint.dir, "out");
  EXPECT_EQ(c.checkpoint.every, 5);
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_TRUE(c.checkpoint.at_start);
  EXPECT_FALSE(c.checkpoint.on_signal);
  EXPECT_DOUBLE_EQ(c.perf.peak_gflops, 100.5);

  // The resolved TOML parses back to the same values.
  const Config r = parse_config(c.toml, "resolved");
  EXPECT_EQ(r.train.steps, 10);
  EXPECT_DOUBLE_EQ(r.train.lr, 1e-3);
  EXPECT_EQ(r.data.path, "data/train.bin");
  EXPECT_EQ(r.parallel.schedule, ScheduleKind::gpipe);
  EXPECT_EQ(r.model.seq_len, 5);
  EXPECT_FALSE(r.checkpoint.on_signal);
}

TEST(Config, DefaultsWhenOnlyTheModelIsGiven) {
  const Config c = parse_config(kModel, "deck.toml");
  const TrainConfig t;
  EXPECT_EQ(c.train.steps, t.steps);
  EXPECT_EQ(c.train.global_batch, t.global_batch);
  EXPECT_EQ(c.train.seed, t.seed);
  EXPECT_EQ(c.data.source, "synthetic");
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::one_f_one_b);
  EXPECT_TRUE(c.checkpoint.on_signal);  // a pre-empted run saves where it stops
}

TEST(Config, MissingModelKey) {
  expect_error("[model]\nlayers = 2\nchannels = 12\nheads = 3\nvocab = 11\n", {"model.seq_len", "missing"});
  expect_error("[train]\nsteps = 3\n", {"model.layers", "missing"});
}

TEST(Config, UnknownKeySuggestsNearest) {
  expect_error(with_model("[train]\nsetps = 10\n"), {"train.setps", "did you mean train.steps"});
  expect_error(with_model("[model.x]\n"), {"model.x"});
  expect_error(with_model("[parallel]\nsequence_paralel = true\n"), {"did you mean parallel.sequence_parallel"});
}

TEST(Config, UnknownSectionSuggestsNearest) {
  expect_error(with_model("[trian]\nsteps = 10\n"), {"[trian]", "did you mean [train]"});
  expect_error(with_model("[checkpoints]\nevery = 1\n"), {"did you mean [checkpoint]"});
}

TEST(Config, WrongTypeNamesKeyAndTypes) {
  expect_error(with_model("[train]\nsteps = \"ten\"\n"), {"train.steps", "integer", "string"});
  expect_error(with_model("[train]\nlr = \"fast\"\n"), {"train.lr", "float", "string"});
  expect_error(with_model("[parallel]\nsequence_parallel = 1\n"), {"parallel.sequence_parallel", "boolean"});
  expect_error(with_model("[train]\nsteps = 2.5\n"), {"train.steps", "integer", "float"});
}

TEST(Config, IntegerAcceptedForFloatKey) {
  const Config c = parse_config(with_model("[train]\nlr = 1\nmin_lr = 0\n"), "deck.toml");
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 0.0);
}

TEST(Config, OutOfRangeNamesTheKey) {
  expect_error(with_model("[train]\nsteps = -1\n"), {"train.steps", "-1"});
  // 12 channels do not split over 5 heads.
  expect_error("[model]\nlayers = 2\nchannels = 12\nheads = 5\nvocab = 11\nseq_len = 5\n",
               {"model.channels", "model.heads"});
  expect_error(with_model("[train]\nglobal_batch = 8\nmicro_batch = 3\n"), {"train.global_batch", "train.micro_batch"});
  expect_error(with_model("[train]\nlr = 0\n"), {"train.lr"});
  expect_error(with_model("[train]\nlr = 1e-3\nmin_lr = 1e-2\n"), {"train.min_lr"});
  expect_error(with_model("[data]\nsource = \"text\"\n"), {"data.path"});
  expect_error(with_model("[data]\nsource = \"text\"\npath = \"a.txt\"\n"), {"model.vocab", "256"});
  expect_error(with_model("[data]\nsource = \"wikipedia\"\n"), {"data.source"});
  expect_error(with_model("[parallel]\nschedule = \"zigzag\"\n"), {"parallel.schedule"});
  expect_error(with_model("[parallel]\ntp = 0\n"), {"parallel.tp"});
  expect_error(with_model("[checkpoint]\nkeep = 0\n"), {"checkpoint.keep"});
  expect_error("[model]\nlayers = 0\nchannels = 12\nheads = 3\nvocab = 11\nseq_len = 5\n", {"model.layers"});
}

TEST(Config, PrecisionIsFp32ByDefaultOrBf16) {
  EXPECT_EQ(parse_config(kModel, "deck.toml").train.precision, Precision::fp32);
  EXPECT_EQ(parse_config(with_model("[train]\nprecision = \"fp32\"\n"), "deck.toml").train.precision, Precision::fp32);
  // bf16 from the deck or --set; any other name refused with the choices.
  EXPECT_EQ(parse_config(with_model("[train]\nprecision = \"bf16\"\n"), "deck.toml").train.precision, Precision::bf16);
  EXPECT_EQ(parse_config(kModel, "deck.toml", {"train.precision=bf16"}).train.precision, Precision::bf16);
  expect_error(with_model("[train]\nprecision = \"fp16\"\n"), {"train.precision", "\"fp16\"", "fp32", "bf16"});
}

// perf.gemm_route = "onednn" is taken exactly where the products can run on
// oneDNN (this test sees the library's own NDMINI_HAVE_ONEDNN), refused with
// the fix elsewhere. The deck's checks once lacked the definition, so every
// build refused it.
TEST(Config, GemmRouteOnednnIsTakenWhereTheBuildHasIt) {
#ifdef NDMINI_HAVE_ONEDNN
  EXPECT_EQ(parse_config(kModel, "deck.toml", {"perf.gemm_route=onednn"}).perf.gemm_route, GemmRoute::onednn);
#else
  expect_error(kModel, {"perf.gemm_route", "this build has no oneDNN"}, {"perf.gemm_route=onednn"});
#endif
  EXPECT_EQ(parse_config(kModel, "deck.toml", {"perf.gemm_route=blas"}).perf.gemm_route, GemmRoute::blas);
}

// One name table per enum parses the deck and prints the value: every name a
// deck may give reads back as the value whose name it is.
TEST(Config, EnumNamesParseAndPrintTheSame) {
  for (const auto& e : kScheduleNames) {
    if (!e.in_deck) continue;
    const Config c = parse_config(kModel, "deck.toml", {std::string("parallel.schedule=") + e.name});
    EXPECT_EQ(c.parallel.schedule, e.value) << e.name;
    EXPECT_STREQ(name_of(c.parallel.schedule), e.name);
  }
  for (const auto& e : kRecomputeNames) {
    const Config c = parse_config(kModel, "deck.toml", {std::string("train.recompute=") + e.name});
    EXPECT_EQ(c.train.recompute, e.value) << e.name;
    EXPECT_STREQ(name_of(c.train.recompute), e.name);
  }
  for (const auto& e : kSavePhaseNames) {
    const Config c =
        parse_config(kModel, "deck.toml",
                     {"fault.kind=enospc", "fault.step=2", "checkpoint.every=2", std::string("fault.phase=") + e.name});
    EXPECT_EQ(c.fault.phase, e.value) << e.name;
  }
  // "none" is what a single-stage run uses, never a deck's value.
  expect_error(kModel, {"parallel.schedule = \"none\"", "\"1f1b\", \"gpipe\" or \"interleaved_1f1b\""},
               {"parallel.schedule=none"});
  expect_error(kModel, {"train.recompute = \"all\"", "must be \"none\" or \"block\""}, {"train.recompute=all"});
}

TEST(Config, IntegerTooLargeForItsKeyIsRefused) {
  // 2^32 + 10 must not wrap to 10 steps (or 2^32 + 2 layers to 2).
  expect_error(with_model("[train]\nsteps = 4294967306\n"), {"train.steps"});
  expect_error("[model]\nlayers = 4294967298\nchannels = 12\nheads = 3\nvocab = 11\nseq_len = 5\n", {"model.layers"});
}

TEST(Config, Overrides) {
  const Config c =
      parse_config(kModel, "deck.toml", {"train.steps=7", "train.lr=1", "parallel.sequence_parallel=true"});
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  // Overrides win over the deck, and a value that is not TOML is a bare string.
  const Config t = parse_config(with_model("[train]\nsteps = 3\n"), "deck.toml",
                                {"train.steps=9", "data.source=text", "data.path=/tmp/in.txt", "model.vocab=256"});
  EXPECT_EQ(t.train.steps, 9);
  EXPECT_EQ(t.data.source, "text");
  EXPECT_EQ(t.data.path, "/tmp/in.txt");
  EXPECT_EQ(t.model.vocab, 256);
  // The resolved deck records the overrides.
  EXPECT_NE(t.toml.find("steps = 9"), std::string::npos) << t.toml;
}

TEST(Config, BadOverrides) {
  expect_error(kModel, {"train.steps", "section.key=value"}, {"train.steps"});
  expect_error(kModel, {"steps=3", "section.key=value"}, {"steps=3"});
  expect_error(kModel, {"did you mean train.steps"}, {"train.setps=3"});
  expect_error(kModel, {"train.steps", "integer", "string"}, {"train.steps=ten"});
  expect_error(kModel, {"train.steps", "-2"}, {"train.steps=-2"});
}

TEST(Config, InvalidTomlNamesOriginAndLine) {
  expect_error("[model]\nlayers = = 2\n", {"deck.toml:2", "not valid TOML"});
}

TEST(Config, FaultSection) {
  const Config none = parse_config(kModel, "deck.toml");
  EXPECT_EQ(none.fault.kind, FaultKind::none);
  EXPECT_FALSE(none.fault.phase.has_value());
  const Config c = parse_config(with_model("[train]\nsteps = 10\n[checkpoint]\nevery = 2\n[fault]\nkind = \"enospc\"\n"
                                           "rank = 1\nstep = 4\nphase = \"rename\"\n"),
                                "deck.toml");
  EXPECT_EQ(c.fault.kind, FaultKind::enospc);
  EXPECT_EQ(c.fault.rank, 1);
  EXPECT_EQ(c.fault.step, 4);
  EXPECT_EQ(c.fault.phase, SavePhase::rename);
  // --set takes a string key's text as the string, even where TOML reads another value ("nan" is a float).
  const Config n = parse_config(kModel, "deck.toml", {"fault.kind=nan", "fault.step=3"});
  EXPECT_EQ(n.fault.kind, FaultKind::nan);
  const Config k = parse_config(kModel, "deck.toml", {"fault.kind=kill", "fault.step=0"});
  EXPECT_EQ(k.fault.kind, FaultKind::kill);
  const Config s = parse_config(kModel, "deck.toml", {"fault.kind=skip_collective", "fault.step=2", "fault.rank=3"});
  EXPECT_EQ(s.fault.kind, FaultKind::skip_collective);
}

TEST(Config, FaultsThatCouldNeverFireAreRefused) {
  const std::string deck = with_model("[train]\nsteps = 10\n[checkpoint]\nevery = 2\n");
  expect_error(deck, {"fault.kind", "\"segv\"", "\"kill\", \"nan\", \"enospc\" or \"skip_collective\""},
               {"fault.kind=segv"});
  expect_error(deck, {"fault.phase", "\"flush\"", "\"create\", \"write\", \"close\", \"rename\" or \"latest\""},
               {"fault.kind=enospc", "fault.phase=flush", "fault.step=2"});
  expect_error(deck, {"fault.kind = \"enospc\" needs fault.phase"}, {"fault.kind=enospc", "fault.step=2"});
  expect_error(deck, {"fault.phase applies to saves", "remove it"},
               {"fault.kind=nan", "fault.phase=write", "fault.step=2"});
  expect_error(deck, {"fault.rank = -1", "a world rank", "-1 (every rank) with fault.kind = \"skip_collective\""},
               {"fault.kind=kill", "fault.rank=-1"});
  // Every rank dropping a group's sums: only groups that sum, only with fault.rank = -1.
  const Config every = parse_config(
      deck, "deck.toml", {"fault.kind=skip_collective", "fault.rank=-1", "fault.step=1", "fault.group=dp_replicate"});
  EXPECT_EQ(every.fault.rank, -1);
  EXPECT_EQ(every.fault.group, "dp_replicate");
  expect_error(deck, {"fault.group = \"cp\"", "a communicator that sums", "cp, pp and ep only exchange"},
               {"fault.kind=skip_collective", "fault.rank=-1", "fault.group=cp"});
  expect_error(deck, {"fault.group applies to", "fault.rank = -1", "remove it"},
               {"fault.kind=skip_collective", "fault.rank=1", "fault.group=tp"});
  expect_error(deck, {"fault.step = -2"}, {"fault.kind=kill", "fault.step=-2"});
  expect_error(deck, {"fault.step = 10", "below train.steps = 10"}, {"fault.kind=kill", "fault.step=10"});
  expect_error(deck, {"fault.step = 10", "below train.steps = 10"}, {"fault.kind=skip_collective", "fault.step=10"});
  // A save fault at a step that is not saved.
  expect_error(deck, {"fault.step = 3", "no checkpoint of that step is saved", "checkpoint.every = 2"},
               {"fault.kind=enospc", "fault.phase=write", "fault.step=3"});
  expect_error(deck, {"fault.step = 12", "no checkpoint of that step is saved"},
               {"fault.kind=kill", "fault.phase=latest", "fault.step=12"});
  expect_error(deck, {"fault.step = 0", "no checkpoint of that step is saved", "checkpoint.at_start = false"},
               {"fault.kind=enospc", "fault.phase=create", "fault.step=0"});
  EXPECT_NO_THROW(parse_config(
      deck, "deck.toml", {"fault.kind=enospc", "fault.phase=create", "fault.step=0", "checkpoint.at_start=true"}));
  // nan at train.steps hits the final state's check, which runs only when that state is saved.
  EXPECT_NO_THROW(parse_config(deck, "deck.toml", {"fault.kind=nan", "fault.step=10"}));
  expect_error(deck, {"fault.step = 10", "is train.steps"}, {"fault.kind=nan", "fault.step=10", "checkpoint.every=3"});
}

TEST(Config, CheckpointGuardKeys) {
  expect_error(with_model("[train]\nweight_decay = 1e30\n"), {"train.weight_decay = 1e+30", "[0, 1]"});
  expect_error(with_model("[train]\nweight_decay = -0.1\n"), {"train.weight_decay", "[0, 1]"});
  EXPECT_NO_THROW(parse_config(with_model("[train]\nweight_decay = 1\n"), "deck.toml"));
  expect_error(with_model("[perf]\nmemory_per_rank_gib = -1\n"), {"perf.memory_per_rank_gib", ">= 0"});
  const Config c =
      parse_config(with_model("[data]\nallow_source_change = true\n[perf]\nmemory_per_rank_gib = 2.5\n"), "deck.toml");
  EXPECT_TRUE(c.data.allow_source_change);
  EXPECT_DOUBLE_EQ(c.perf.memory_per_rank_gib, 2.5);
}

TEST(Config, CommTimeout) {
  EXPECT_DOUBLE_EQ(parse_config(kModel, "deck.toml").comm.timeout_s, CommConfig{}.timeout_s);
  const Config c = parse_config(with_model("[comm]\ntimeout_s = 30\n"), "deck.toml");
  EXPECT_DOUBLE_EQ(c.comm.timeout_s, 30.0);
  EXPECT_DOUBLE_EQ(parse_config(c.toml, "resolved").comm.timeout_s, 30.0);
  EXPECT_DOUBLE_EQ(parse_config(kModel, "deck.toml", {"comm.timeout_s=0"}).comm.timeout_s, 0.0);
  expect_error(with_model("[comm]\ntimeout = 5\n"), {"comm.timeout", "did you mean comm.timeout_s"});
  // The bounds are accepted; a deadline beyond them (or none a number) would
  // overflow the clock or call a healthy collective a hang: one message each.
  for (const char* ok : {"0.1", "604800", "600"})
    EXPECT_NO_THROW(parse_config(kModel, "deck.toml", {std::string("comm.timeout_s=") + ok})) << ok;
  for (const char* bad : {"-1", "1e-9", "0.09", "604801", "1e300", "inf", "-inf", "nan"}) {
    SCOPED_TRACE(bad);
    const std::string msg = error_of(kModel, {std::string("comm.timeout_s=") + bad});
    EXPECT_NE(msg.find("comm.timeout_s = "), std::string::npos) << msg;
    EXPECT_NE(msg.find("must be 0 (no deadline) or between 0.1 and 604800 seconds"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(Config, CommProgressPoll) {
  EXPECT_DOUBLE_EQ(parse_config(kModel, "deck.toml").comm.progress_poll_us, 100.0);
  const Config c = parse_config(with_model("[comm]\nprogress_poll_us = 250\n"), "deck.toml");
  EXPECT_DOUBLE_EQ(c.comm.progress_poll_us, 250.0);
  EXPECT_DOUBLE_EQ(parse_config(c.toml, "resolved").comm.progress_poll_us, 250.0);
  EXPECT_DOUBLE_EQ(parse_config(kModel, "deck.toml", {"comm.progress_poll_us=0"}).comm.progress_poll_us, 0.0);
  expect_error(with_model("[comm]\nprogress_poll_us = -1\n"), {"comm.progress_poll_us", "out of range"});
  expect_error(with_model("[comm]\nprogress_poll_us = 2e6\n"), {"comm.progress_poll_us", "out of range"});
}

TEST(Config, CommReduceDtype) {
  EXPECT_EQ(parse_config(kModel, "deck.toml").comm.reduce_dtype, Precision::fp32);
  const Config c =
      parse_config(with_model("[train]\nprecision = \"bf16\"\n[comm]\nreduce_dtype = \"bf16\"\n"), "deck.toml");
  EXPECT_EQ(c.comm.reduce_dtype, Precision::bf16);
  EXPECT_EQ(parse_config(c.toml, "resolved").comm.reduce_dtype, Precision::bf16);
  EXPECT_EQ(parse_config(kModel, "deck.toml", {"train.precision=bf16", "comm.reduce_dtype=fp32"}).comm.reduce_dtype,
            Precision::fp32);
  expect_error(with_model("[train]\nprecision = \"bf16\"\n[comm]\nreduce_dtype = \"fp16\"\n"),
               {"comm.reduce_dtype", "\"fp16\"", "fp32", "bf16"});
  // An fp32 run reduces in fp32, so it stays exact: bf16 reductions under it are refused, naming both keys.
  expect_error(with_model("[comm]\nreduce_dtype = \"bf16\"\n"),
               {"comm.reduce_dtype = \"bf16\" needs train.precision = \"bf16\"", "comm.reduce_dtype = \"fp32\""});
}

// The resolved deck prints each float in its shortest form that reads back
// as the same double (checkpoints store it and a resume parses it again).
TEST(Config, ResolvedFloatsAreShortAndRoundTripBitExactly) {
  const Config c = parse_config(with_model("[train]\nlr = 6e-4\ngrad_clip = 1.0\n"), "deck.toml");
  EXPECT_TRUE(c.toml.find("lr = 6e-04") != std::string::npos || c.toml.find("lr = 0.0006") != std::string::npos)
      << c.toml;
  EXPECT_EQ(c.toml.find("0.00059999"), std::string::npos) << c.toml;
  EXPECT_NE(c.toml.find("grad_clip = 1.0"), std::string::npos) << "an integral float stays a float:\n" << c.toml;

  // Every float key, with values whose decimal forms are long: bit for bit after the round trip.
  auto bits = [](double v) {
    std::uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  };
  const std::vector<double> values = {6e-4, 0.1 + 0.2, 1.0 / 3, 2.0 / 3, 5e-324, 1e-300, 0.1, 1.0, 7.0, 123456.789};
  for (const double v : values) {
    const double lr = std::min(v, 9.0), fraction = std::min(v, 0.5), decay = std::min(v, 1.0);
    const double timeout = std::min(std::max(v, 0.1), 604800.0);  // comm.timeout_s's range
    const std::vector<std::string> set = {
        "data.source=\"tokens\"",
        "data.path=\"x.bin\"",
        "data.val_fraction=" + shortest_float(fraction),
        "train.lr=" + shortest_float(lr),
        "train.min_lr=" + shortest_float(lr / 3),
        "train.weight_decay=" + shortest_float(decay),
        "train.grad_clip=" + shortest_float(v),
        "comm.timeout_s=" + shortest_float(timeout),
        "comm.progress_poll_us=" + shortest_float(v),
        "perf.peak_gflops=" + shortest_float(v),
        "perf.memory_per_rank_gib=" + shortest_float(v),
    };
    const Config a = parse_config(kModel, "deck.toml", set);
    const Config b = parse_config(a.toml, "resolved");
    SCOPED_TRACE(a.toml);
    EXPECT_EQ(bits(b.data.val_fraction), bits(a.data.val_fraction));
    EXPECT_EQ(bits(a.data.val_fraction), bits(fraction));
    EXPECT_EQ(bits(b.train.lr), bits(a.train.lr));
    EXPECT_EQ(bits(a.train.lr), bits(lr));
    EXPECT_EQ(bits(b.train.min_lr), bits(a.train.min_lr));
    EXPECT_EQ(bits(b.train.weight_decay), bits(a.train.weight_decay));
    EXPECT_EQ(bits(b.train.grad_clip), bits(a.train.grad_clip));
    EXPECT_EQ(bits(a.train.grad_clip), bits(v));
    EXPECT_EQ(bits(b.comm.timeout_s), bits(a.comm.timeout_s));
    EXPECT_EQ(bits(b.comm.progress_poll_us), bits(a.comm.progress_poll_us));
    EXPECT_EQ(bits(b.perf.peak_gflops), bits(a.perf.peak_gflops));
    EXPECT_EQ(bits(b.perf.memory_per_rank_gib), bits(a.perf.memory_per_rank_gib));
    EXPECT_EQ(b.toml, a.toml);  // printing is a fixed point
  }
  // The shortest form of many doubles reads back exactly.
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 20000; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    double v;
    std::memcpy(&v, &x, sizeof v);
    if (!std::isfinite(v)) continue;
    const std::string text = shortest_float(v);
    ASSERT_EQ(bits(std::strtod(text.c_str(), nullptr)), bits(v)) << text;
  }
  EXPECT_EQ(shortest_float(3.0), "3.0");
  EXPECT_EQ(shortest_float(0.1), "0.1");
  EXPECT_EQ(shortest_float(std::numeric_limits<double>::infinity()), "inf");
}

TEST(Config, ValidationKeys) {
  const Config d = parse_config(kModel, "deck.toml");
  EXPECT_EQ(d.train.eval_every, 0);
  EXPECT_EQ(d.train.eval_batches, 1);
  EXPECT_EQ(d.data.val_fraction, 0.0);
  const Config c = parse_config(with_model("[train]\neval_every = 5\neval_batches = 2\n"), "deck.toml");
  EXPECT_EQ(c.train.eval_every, 5);
  EXPECT_EQ(c.train.eval_batches, 2);
  const std::string text = with_model("[data]\nsource = \"tokens\"\npath = \"a.bin\"\n");
  const Config f = parse_config(text, "deck.toml", {"data.val_fraction=0.1", "train.eval_every=2"});
  EXPECT_DOUBLE_EQ(f.data.val_fraction, 0.1);
  EXPECT_EQ(parse_config(text, "deck.toml", {"data.val_path=b.txt", "train.eval_every=2"}).data.val_path, "b.txt");

  expect_error(with_model("[train]\neval_every = -1\n"), {"train.eval_every = -1", "must be >= 0"});
  expect_error(with_model("[train]\neval_batches = 0\n"), {"train.eval_batches = 0", "at least 1"});
  expect_error(text, {"data.val_fraction = 1", "[0, 1)"}, {"data.val_fraction=1.0"});
  expect_error(text, {"data.val_fraction = -0.5", "[0, 1)"}, {"data.val_fraction=-0.5"});
  expect_error(text, {"data.val_path and data.val_fraction", "set one"},
               {"data.val_path=b.txt", "data.val_fraction=0.1"});
  expect_error(text, {"train.eval_every = 3 needs held-out data for data.source = \"tokens\"", "data.val_path"},
               {"train.eval_every=3"});
  expect_error(kModel, {"data.val_path applies to data.source = \"text\" or \"tokens\""}, {"data.val_path=b.txt"});
  expect_error(kModel, {"data.val_fraction applies to"}, {"data.val_fraction=0.2"});
  expect_error(with_model("[train]\neval_every = \"often\"\n"), {"train.eval_every", "integer"});
}

// The architecture keys: GPT-2's by default, Llama's under model.family =
// "llama", and a key given beside the family wins (from the deck or --set).
TEST(Config, ArchitectureIsGpt2ByDefault) {
  const Config c = parse_config(kModel, "deck.toml");
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.family, ModelFamily::gpt2);
  EXPECT_EQ(m.norm, NormKind::layernorm);
  EXPECT_EQ(m.position, PositionKind::learned);
  EXPECT_EQ(m.mlp, MlpKind::gelu);
  EXPECT_EQ(m.ffn(), 4 * m.channels);
  EXPECT_EQ(m.kv(), m.heads);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_TRUE(m.bias);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(m.rope_theta, 10000.0);
  EXPECT_TRUE(m.gpt2_blocks());
}

TEST(Config, LlamaFamilySetsTheDefaultsAndGivenKeysWin) {
  const std::string llama = with_model("family = \"llama\"\nffn_hidden = 32\n");
  // with_model's [model] table is the last one opened before the extra lines.
  const Config c = parse_config(llama, "deck.toml");
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.norm, NormKind::rmsnorm);
  EXPECT_EQ(m.position, PositionKind::rope);
  EXPECT_EQ(m.mlp, MlpKind::swiglu);
  EXPECT_FALSE(m.bias);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.ffn(), 32);
  EXPECT_FALSE(m.gpt2_blocks());
  EXPECT_EQ(c.key_origin.at("model.norm"), "model.family");
  // A key given beside the family wins, from the deck or from --set.
  const Config d = parse_config(with_model("family = \"llama\"\nffn_hidden = 32\nbias = true\n"), "deck.toml",
                                {"model.position=learned"});
  EXPECT_TRUE(d.model.bias);
  EXPECT_EQ(d.model.position, PositionKind::learned);
  EXPECT_EQ(d.model.norm, NormKind::rmsnorm);
  EXPECT_EQ(d.key_origin.at("model.position"), "--set");
  // The resolved deck carries the family's values, so it reads back the same.
  const Config again = parse_config(effective_toml(c), "resolved.toml");
  EXPECT_EQ(again.model.norm, NormKind::rmsnorm);
  EXPECT_FALSE(again.model.tie_embeddings);
}

TEST(Config, ArchitectureMistakesAreRefusedWithTheFix) {
  // swiglu has no default width.
  expect_error(with_model("mlp = \"swiglu\"\n"), {"model.mlp", "model.ffn_hidden"});
  expect_error(with_model("family = \"llama\"\n"), {"model.ffn_hidden"});
  // kv_heads divides heads (3 here).
  expect_error(with_model("kv_heads = 2\n"), {"model.kv_heads", "must divide model.heads = 3"});
  expect_error(with_model("kv_heads = -1\n"), {"model.kv_heads"});
  expect_error(with_model("norm_eps = 0\n"), {"model.norm_eps"});
  expect_error(with_model("rope_theta = 1\n"), {"model.rope_theta"});
  expect_error(with_model("ffn_hidden = -4\n"), {"model.ffn_hidden"});
  expect_error(with_model("norm = \"batchnorm\"\n"), {"model.norm", "layernorm", "rmsnorm"});
  expect_error(with_model("family = \"mistral\"\n"), {"model.family", "gpt2", "llama"});
  // rope rotates pairs: a head of 12 / 4 = 3 channels cannot.
  expect_error("[model]\nlayers = 2\nchannels = 12\nheads = 4\nvocab = 11\nseq_len = 5\nposition = \"rope\"\n",
               {"model.channels", "even", "rope"});
}

// Mixture-of-Experts keys: 0 experts (the default) is the dense model, and
// every MoE key has its default; each mistake is one message naming the key.
TEST(Config, MoeKeysDefaultToADenseModel) {
  const Config c = parse_config(kModel, "deck.toml");
  EXPECT_FALSE(c.model.moe());
  EXPECT_EQ(c.model.moe_blocks(), 0);
  EXPECT_EQ(c.parallel.ep, 1);
  EXPECT_EQ(c.model.moe_score, MoeScore::softmax);
  EXPECT_EQ(c.model.moe_router, MoeRouter::learned);
  EXPECT_DOUBLE_EQ(c.train.moe_max_load, 0.0);
}

TEST(Config, MoeKeysRoundTripAndSelectTheBlocks) {
  const std::string deck =
      "[model]\nlayers = 6\nchannels = 12\nheads = 3\nvocab = 11\nseq_len = 5\n"
      "moe_experts = 8\nmoe_top_k = 2\nmoe_every = 2\nmoe_dense_first = 1\nmoe_hidden = 24\n"
      "moe_shared_hidden = 12\nmoe_score = \"sigmoid\"\nmoe_router = \"balanced\"\n"
      "[train]\nmoe_bias_rate = 0.001\nmoe_seq_aux = 0.0001\nmoe_z_loss = 0.001\n"
      "moe_max_load = 2.5\n[parallel]\nep = 4\n";
  const Config c = parse_config(deck, "deck.toml");
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.moe_experts, 8);
  EXPECT_EQ(m.moe_top_k, 2);
  EXPECT_EQ(m.moe_ffn(), 24);
  EXPECT_EQ(m.moe_shared_hidden, 12);
  EXPECT_EQ(m.moe_score, MoeScore::sigmoid);
  EXPECT_EQ(m.moe_router, MoeRouter::balanced);
  EXPECT_DOUBLE_EQ(c.train.moe_bias_rate, 0.001);
  EXPECT_DOUBLE_EQ(c.train.moe_seq_aux, 0.0001);
  EXPECT_DOUBLE_EQ(c.train.moe_z_loss, 0.001);
  EXPECT_DOUBLE_EQ(c.train.moe_max_load, 2.5);
  EXPECT_EQ(c.parallel.ep, 4);
  // Blocks from moe_dense_first on whose index is a multiple of moe_every: 2 and 4.
  const std::vector<bool> moe = {false, false, true, false, true, false};
  for (int l = 0; l < m.layers; ++l) EXPECT_EQ(m.moe_block(l), moe[l]) << "block " << l;
  EXPECT_EQ(m.moe_blocks(), 2);
  // The expert width defaults to the dense MLP's.
  EXPECT_EQ(parse_config(deck, "deck.toml", {"model.moe_hidden=0"}).model.moe_ffn(), 48);
  // The resolved deck reads back the same.
  const Config again = parse_config(effective_toml(c), "resolved.toml");
  EXPECT_EQ(again.model.moe_dense_first, 1);
  EXPECT_EQ(again.model.moe_score, MoeScore::sigmoid);
  EXPECT_EQ(again.parallel.ep, 4);
}

TEST(Config, MoeMistakesAreRefusedOneMessageEach) {
  const std::string moe = with_model("moe_experts = 4\n");
  expect_error(moe, {"model.moe_top_k = 0 is out of range", "between 1 and model.moe_experts = 4"},
               {"model.moe_top_k=0"});
  expect_error(moe, {"model.moe_top_k = 5 is out of range", "between 1 and model.moe_experts = 4"},
               {"model.moe_top_k=5"});
  expect_error(moe, {"model.moe_experts = 4 is out of range", "multiple of parallel.ep = 3"}, {"parallel.ep=3"});
  expect_error(moe, {"model.moe_every = 0 is out of range", "at least 1"}, {"model.moe_every=0"});
  expect_error(moe, {"model.moe_dense_first = 2", "leaves no MoE block among the 2 layers"},
               {"model.moe_dense_first=2"});
  expect_error(moe, {"model.moe_dense_first = -1", "must be >= 0"}, {"model.moe_dense_first=-1"});
  expect_error(moe, {"model.moe_hidden = -1", "must be >= 0"}, {"model.moe_hidden=-1"});
  expect_error(moe, {"model.moe_shared_hidden = -8", "must be >= 0"}, {"model.moe_shared_hidden=-8"});
  expect_error(moe, {"model.moe_experts = -2", "must be >= 0"}, {"model.moe_experts=-2"});
  // Negative rates, and a load bound below the mean.
  expect_error(moe, {"train.moe_bias_rate = -0.001", "must be >= 0"},
               {"model.moe_score=sigmoid", "train.moe_bias_rate=-0.001"});
  expect_error(moe, {"train.moe_seq_aux = -1", "must be >= 0"}, {"train.moe_seq_aux=-1"});
  expect_error(moe, {"train.moe_z_loss = -1", "must be >= 0"}, {"train.moe_z_loss=-1"});
  expect_error(moe, {"train.moe_max_load = 0.5", "a multiple of the mean load"}, {"train.moe_max_load=0.5"});
  // The bias is the sigmoid router's.
  expect_error(moe, {"train.moe_bias_rate = 0.001 applies to model.moe_score = \"sigmoid\""},
               {"train.moe_bias_rate=0.001"});
  expect_error(moe, {"model.moe_score", "\"softmax\" or \"sigmoid\""}, {"model.moe_score=topk"});
  expect_error(moe, {"model.moe_router", "\"learned\" or \"balanced\""}, {"model.moe_router=random"});
  // ep without experts, and ep below 1.
  expect_error(kModel, {"parallel.ep = 2 is out of range", "set model.moe_experts"}, {"parallel.ep=2"});
  expect_error(moe, {"parallel.ep = 0 is out of range", "a degree >= 1"}, {"parallel.ep=0"});
  // Each accepted on its own.
  EXPECT_EQ(error_of(moe, {"parallel.ep=4", "model.moe_top_k=4"}), "");
}
