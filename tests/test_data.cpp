// SPDX-License-Identifier: BSD-3-Clause
// The data sources read in the order docs/model.md ("Data") fixes: for a file of N tokens,
// sequence b of the global batch of B sequences at step s starts at token
// ((s * B + b) * T) mod (N - T - 1); targets are the inputs shifted by one.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "core/error.hpp"
#include "train/data.hpp"

using namespace ndmini;

namespace {

Config deck(const std::string& source, const std::string& path, int vocab) {
  const std::string text = "[model]\nlayers = 1\nchannels = 8\nheads = 2\nvocab = " + std::to_string(vocab) +
                           "\nseq_len = 5\n[train]\nglobal_batch = 3\nmicro_batch = 1\n[data]\nsource = \"" + source +
                           "\"\npath = \"" + path + "\"\n";
  return parse_config(text, "deck.toml");
}

std::string scratch(const std::string& name) { return "ndmini_test_data_" + std::to_string(::getpid()) + "_" + name; }

// Checks every sequence of a few steps against the offsets of docs/model.md in `stream`.
void expect_design_order(const DataSource& data, const std::vector<token_t>& stream, int B, int T) {
  const std::size_t span = stream.size() - T - 1;
  for (std::int64_t step = 0; step < 7; ++step)
    for (int b = 0; b < B; ++b) {
      std::vector<token_t> in(T), tg(T);
      data.fill(step, b, 1, in.data(), tg.data());
      const std::size_t o = ((step * B + b) * T) % span;
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[t], stream[o + t]) << "step " << step << " sequence " << b << " t " << t;
        ASSERT_EQ(tg[t], stream[o + t + 1]) << "step " << step << " sequence " << b << " t " << t;
      }
    }
}

}  // namespace

TEST(Data, TokenFileIsReadInDesignOrder) {
  std::vector<std::uint16_t> tokens(23);
  std::vector<token_t> stream(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) stream[i] = tokens[i] = static_cast<std::uint16_t>((i * 7 + 3) % 40);
  const std::string path = scratch("tokens.bin");
  write_token_file(path, tokens);
  const auto data = make_data_source(deck("tokens", path, 40));
  expect_design_order(*data, stream, 3, 5);
  std::remove(path.c_str());
}

TEST(Data, TokenOutsideTheVocabularyIsRefused) {
  const std::string path = scratch("big.bin");
  write_token_file(path, std::vector<std::uint16_t>(20, 50256));
  try {
    make_data_source(deck("tokens", path, 256));
    ADD_FAILURE() << "a token id >= vocab was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("holds token id 50256 but model.vocab = 256"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(Data, TextIsReadAsBytesInDesignOrder) {
  const std::string text = "the quick brown fox jumps over the lazy dog";
  const std::string path = scratch("text.txt");
  std::ofstream(path, std::ios::binary) << text;
  const auto data = make_data_source(deck("text", path, 256));
  expect_design_order(*data, std::vector<token_t>(text.begin(), text.end()), 3, 5);
  std::remove(path.c_str());
}

TEST(Data, SyntheticIsAPureFunctionOfSeedAndStep) {
  const auto a = make_data_source(deck("synthetic", "", 256));
  const auto b = make_data_source(deck("synthetic", "", 256));
  std::vector<token_t> in1(5), tg1(5), in2(5), tg2(5), all_in(15), all_tg(15);
  a->fill(4, 2, 1, in1.data(), tg1.data());
  b->fill(4, 2, 1, in2.data(), tg2.data());
  EXPECT_EQ(in1, in2);
  EXPECT_EQ(tg1, tg2);
  // The same sequence whichever slice of the batch asks for it.
  a->fill(4, 0, 3, all_in.data(), all_tg.data());
  EXPECT_EQ(in1, std::vector<token_t>(all_in.begin() + 10, all_in.end()));
  // Targets are the next inputs.
  for (int t = 0; t + 1 < 5; ++t) EXPECT_EQ(tg1[t], in1[t + 1]);
  // Another step gives another sequence.
  a->fill(5, 2, 1, in2.data(), tg2.data());
  EXPECT_NE(in1, in2);
}

// What a checkpoint records of the data, and what a resume makes of it.
TEST(Data, ProvenanceOfFilesAndResumeChecks) {
  const std::string a = scratch("a.txt"), b = scratch("b.txt");
  std::string text(3000, 'x');
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 23);
  std::ofstream(a) << text;
  text[100] = '#';  // same size, other content
  std::ofstream(b) << text;
  const auto ra = make_data_source(deck("text", a, 256))->provenance();
  const auto rb = make_data_source(deck("text", b, 256))->provenance();
  EXPECT_EQ(ra.kind, "text");
  EXPECT_EQ(ra.path, a);
  EXPECT_EQ(ra.bytes, 3000u);
  EXPECT_EQ(ra.digest.size(), 16u);
  EXPECT_EQ(rb.bytes, ra.bytes);
  EXPECT_NE(rb.digest, ra.digest);
  EXPECT_EQ(make_data_source(deck("synthetic", "", 256))->provenance().kind, "synthetic");

  DataConfig strict, lenient;
  lenient.allow_source_change = true;
  EXPECT_EQ(check_resume_data(ra, ra, strict, "ckpt/step_00000002"), "");
  try {
    check_resume_data(ra, rb, strict, "ckpt/step_00000002");
    ADD_FAILURE() << "a different file was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot resume from ckpt/step_00000002: it was trained on text '" + a + "'"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("the deck reads text '" + b + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.allow_source_change = true"), std::string::npos) << msg;
  }
  EXPECT_NE(check_resume_data(ra, rb, lenient, "ckpt").find("(data.allow_source_change = true)"), std::string::npos);
  auto moved = ra;
  moved.path = "elsewhere/" + a;
  EXPECT_NE(check_resume_data(ra, moved, strict, "ckpt").find("with the same size and digest"), std::string::npos);
  auto synthetic = ra;
  synthetic = {"synthetic", "", 0, ""};
  EXPECT_THROW(check_resume_data(synthetic, ra, strict, "ckpt"), Error);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(Data, FolderAsDataPathIsNamed) {
  const std::string dir = scratch("folder");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  try {
    make_data_source(deck("tokens", dir, 256));
    ADD_FAILURE() << "a folder was read as data";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.path = \"" + dir + "\" is a folder, not a regular file"),
              std::string::npos)
        << e.what();
  }
  ::rmdir(dir.c_str());
}
