// SPDX-License-Identifier: BSD-3-Clause
#include "config/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>
#include <type_traits>

#include "config/effective.hpp"
#include "core/error.hpp"
#include "core/regular_file.hpp"

namespace ndmini {
namespace {

// One deck key: where it lives, what type it has, and how to store it.
struct Key {
  std::string section;
  std::string name;
  std::string type;  // "integer", "float", "string", "boolean"
  std::function<void(Config&, const toml::node&)> store;
  // The field's value in `c` as TOML text (docs/deck.md shows the defaults).
  std::function<std::string(const Config&)> show;
  // Integers must fit the field they land in (no silent wrap-around).
  std::int64_t min_int = std::numeric_limits<int>::min();
  std::int64_t max_int = std::numeric_limits<int>::max();
  // Strings that name an enum value: the rule a value not in its table
  // breaks ("must be \"none\" or \"block\""), empty when the value is valid.
  std::function<std::string(const std::string&)> broken_rule = nullptr;
  std::string dotted() const { return section + "." + name; }
};

std::string toml_text(int v) { return std::to_string(v); }
std::string toml_text(std::uint64_t v) { return std::to_string(v); }
std::string toml_text(double v) { return shortest_float(v); }
// A TOML basic string: quotes, backslashes and control characters escaped,
// so a path holding them reads back as itself.
std::string toml_text(const std::string& v) {
  std::string out = "\"";
  for (const char ch : v) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}
std::string toml_text(bool v) { return v ? "true" : "false"; }
// An enum by its name in its table, as a deck writes it; an absent one as "".
template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
std::string toml_text(E v) {
  return toml_text(std::string(name_of(v)));
}
template <class E>
std::string toml_text(const std::optional<E>& v) {
  return v ? toml_text(*v) : toml_text(std::string());
}

template <class T, class F>
std::function<std::string(const Config&)> shower(T Config::*sec, F T::*field) {
  return [sec, field](const Config& c) { return toml_text(c.*sec.*field); };
}

// "\"a\", \"b\" or \"c\"": the values a deck may give, from the name table.
template <class E, std::size_t N>
std::string choices_text(const EnumName<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& e : table)
    if (e.in_deck) names.push_back("\"" + std::string(e.name) + "\"");
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

template <class E, std::size_t N>
std::optional<E> parse_in(const EnumName<E> (&table)[N], const std::string& name) {
  for (const auto& e : table)
    if (e.in_deck && name == e.name) return e.value;
  return std::nullopt;
}

template <class T>
Key int_key(const char* section, const char* name, T Config::*sec, int(T::*field)) {
  return {section, name, "integer",
          [sec, field](Config& c, const toml::node& n) { c.*sec.*field = static_cast<int>(*n.value<std::int64_t>()); },
          shower(sec, field)};
}
template <class T>
Key u64_key(const char* section, const char* name, T Config::*sec, std::uint64_t(T::*field)) {
  Key k{section, name, "integer",
        [sec, field](Config& c, const toml::node& n) {
          c.*sec.*field = static_cast<std::uint64_t>(*n.value<std::int64_t>());
        },
        shower(sec, field)};
  k.min_int = 0;
  k.max_int = std::numeric_limits<std::int64_t>::max();
  return k;
}
template <class T>
Key float_key(const char* section, const char* name, T Config::*sec, double(T::*field)) {
  return {section, name, "float", [sec, field](Config& c, const toml::node& n) { c.*sec.*field = *n.value<double>(); },
          shower(sec, field)};
}
template <class T>
Key string_key(const char* section, const char* name, T Config::*sec, std::string(T::*field)) {
  return {section, name, "string",
          [sec, field](Config& c, const toml::node& n) { c.*sec.*field = *n.value<std::string>(); },
          shower(sec, field)};
}
// An enum given by name; `note` follows the list of names in the message.
template <class T, class E, std::size_t N>
Key enum_key(const char* section, const char* name, T Config::*sec, E(T::*field), const EnumName<E> (&table)[N],
             const std::string& note = "") {
  Key k{section, name, "string",
        [sec, field, &table](Config& c, const toml::node& n) {
          c.*sec.*field = *parse_in(table, *n.value<std::string>());
        },
        shower(sec, field)};
  k.broken_rule = [&table, note](const std::string& v) {
    return parse_in(table, v) ? std::string() : "must be " + choices_text(table) + note;
  };
  return k;
}
// The same for a setting that may be absent (an empty string: absent).
template <class T, class E, std::size_t N>
Key optional_enum_key(const char* section, const char* name, T Config::*sec, std::optional<E>(T::*field),
                      const EnumName<E> (&table)[N], const std::string& note = "") {
  Key k{section, name, "string",
        [sec, field, &table](Config& c, const toml::node& n) {
          const std::string v = *n.value<std::string>();
          c.*sec.*field = v.empty() ? std::nullopt : parse_in(table, v);
        },
        shower(sec, field)};
  k.broken_rule = [&table, note](const std::string& v) {
    return v.empty() || parse_in(table, v) ? std::string() : "must be " + choices_text(table) + note;
  };
  return k;
}
template <class T>
Key bool_key(const char* section, const char* name, T Config::*sec, bool(T::*field)) {
  return {section, name, "boolean", [sec, field](Config& c, const toml::node& n) { c.*sec.*field = *n.value<bool>(); },
          shower(sec, field)};
}

const std::vector<Key>& schema() {
  static const std::vector<Key> keys = {
      int_key("model", "layers", &Config::model, &ModelConfig::layers),
      int_key("model", "channels", &Config::model, &ModelConfig::channels),
      int_key("model", "heads", &Config::model, &ModelConfig::heads),
      int_key("model", "vocab", &Config::model, &ModelConfig::vocab),
      int_key("model", "seq_len", &Config::model, &ModelConfig::seq_len),
      enum_key("model", "family", &Config::model, &ModelConfig::family, kModelFamilyNames),
      enum_key("model", "norm", &Config::model, &ModelConfig::norm, kNormNames),
      float_key("model", "norm_eps", &Config::model, &ModelConfig::norm_eps),
      enum_key("model", "position", &Config::model, &ModelConfig::position, kPositionNames),
      float_key("model", "rope_theta", &Config::model, &ModelConfig::rope_theta),
      enum_key("model", "mlp", &Config::model, &ModelConfig::mlp, kMlpNames),
      int_key("model", "ffn_hidden", &Config::model, &ModelConfig::ffn_hidden),
      int_key("model", "kv_heads", &Config::model, &ModelConfig::kv_heads),
      bool_key("model", "tie_embeddings", &Config::model, &ModelConfig::tie_embeddings),
      bool_key("model", "bias", &Config::model, &ModelConfig::bias),
      int_key("model", "moe_experts", &Config::model, &ModelConfig::moe_experts),
      int_key("model", "moe_top_k", &Config::model, &ModelConfig::moe_top_k),
      int_key("model", "moe_every", &Config::model, &ModelConfig::moe_every),
      int_key("model", "moe_dense_first", &Config::model, &ModelConfig::moe_dense_first),
      int_key("model", "moe_hidden", &Config::model, &ModelConfig::moe_hidden),
      int_key("model", "moe_shared_hidden", &Config::model, &ModelConfig::moe_shared_hidden),
      enum_key("model", "moe_score", &Config::model, &ModelConfig::moe_score, kMoeScoreNames),
      enum_key("model", "moe_router", &Config::model, &ModelConfig::moe_router, kMoeRouterNames),
      string_key("data", "source", &Config::data, &DataConfig::source),
      string_key("data", "path", &Config::data, &DataConfig::path),
      bool_key("data", "allow_source_change", &Config::data, &DataConfig::allow_source_change),
      string_key("data", "val_path", &Config::data, &DataConfig::val_path),
      float_key("data", "val_fraction", &Config::data, &DataConfig::val_fraction),
      int_key("train", "steps", &Config::train, &TrainConfig::steps),
      int_key("train", "global_batch", &Config::train, &TrainConfig::global_batch),
      int_key("train", "micro_batch", &Config::train, &TrainConfig::micro_batch),
      u64_key("train", "seed", &Config::train, &TrainConfig::seed),
      float_key("train", "lr", &Config::train, &TrainConfig::lr),
      float_key("train", "min_lr", &Config::train, &TrainConfig::min_lr),
      int_key("train", "warmup_steps", &Config::train, &TrainConfig::warmup_steps),
      float_key("train", "weight_decay", &Config::train, &TrainConfig::weight_decay),
      float_key("train", "grad_clip", &Config::train, &TrainConfig::grad_clip),
      int_key("train", "log_every", &Config::train, &TrainConfig::log_every),
      enum_key("train", "recompute", &Config::train, &TrainConfig::recompute, kRecomputeNames),
      enum_key("train", "precision", &Config::train, &TrainConfig::precision, kPrecisionNames),
      int_key("train", "eval_every", &Config::train, &TrainConfig::eval_every),
      int_key("train", "eval_batches", &Config::train, &TrainConfig::eval_batches),
      float_key("train", "moe_bias_rate", &Config::train, &TrainConfig::moe_bias_rate),
      float_key("train", "moe_seq_aux", &Config::train, &TrainConfig::moe_seq_aux),
      float_key("train", "moe_z_loss", &Config::train, &TrainConfig::moe_z_loss),
      float_key("train", "moe_max_load", &Config::train, &TrainConfig::moe_max_load),
      int_key("parallel", "dp_replicate", &Config::parallel, &ParallelConfig::dp_replicate),
      int_key("parallel", "dp_shard", &Config::parallel, &ParallelConfig::dp_shard),
      int_key("parallel", "tp", &Config::parallel, &ParallelConfig::tp),
      int_key("parallel", "cp", &Config::parallel, &ParallelConfig::cp),
      int_key("parallel", "pp", &Config::parallel, &ParallelConfig::pp),
      bool_key("parallel", "sequence_parallel", &Config::parallel, &ParallelConfig::sequence_parallel),
      bool_key("parallel", "reshard_after_forward", &Config::parallel, &ParallelConfig::reshard_after_forward),
      enum_key("parallel", "schedule", &Config::parallel, &ParallelConfig::schedule, kScheduleNames),
      int_key("parallel", "virtual_stages", &Config::parallel, &ParallelConfig::virtual_stages),
      int_key("parallel", "ep", &Config::parallel, &ParallelConfig::ep),
      string_key("checkpoint", "dir", &Config::checkpoint, &CheckpointConfig::dir),
      int_key("checkpoint", "every", &Config::checkpoint, &CheckpointConfig::every),
      int_key("checkpoint", "keep", &Config::checkpoint, &CheckpointConfig::keep),
      bool_key("checkpoint", "at_start", &Config::checkpoint, &CheckpointConfig::at_start),
      bool_key("checkpoint", "on_signal", &Config::checkpoint, &CheckpointConfig::on_signal),
      bool_key("checkpoint", "async", &Config::checkpoint, &CheckpointConfig::async),
      float_key("comm", "timeout_s", &Config::comm, &CommConfig::timeout_s),
      float_key("comm", "progress_poll_us", &Config::comm, &CommConfig::progress_poll_us),
      enum_key("comm", "reduce_dtype", &Config::comm, &CommConfig::reduce_dtype, kPrecisionNames),
      float_key("perf", "peak_gflops", &Config::perf, &PerfConfig::peak_gflops),
      enum_key("perf", "gemm_route", &Config::perf, &PerfConfig::gemm_route, kGemmRouteNames),
      float_key("perf", "memory_per_rank_gib", &Config::perf, &PerfConfig::memory_per_rank_gib),
      string_key("perf", "cluster", &Config::perf, &PerfConfig::cluster),
      float_key("perf", "moe_imbalance", &Config::perf, &PerfConfig::moe_imbalance),
      enum_key("fault", "kind", &Config::fault, &FaultConfig::kind, kFaultKindNames),
      int_key("fault", "rank", &Config::fault, &FaultConfig::rank),
      int_key("fault", "step", &Config::fault, &FaultConfig::step),
      optional_enum_key("fault", "phase", &Config::fault, &FaultConfig::phase, kSavePhaseNames,
                        " (the phases of a save)"),
      string_key("fault", "group", &Config::fault, &FaultConfig::group),
  };
  return keys;
}

// The model's shape has no default: a deck must give it.
bool required(const Key& key) {
  static const char* const shape[] = {"layers", "channels", "heads", "vocab", "seq_len"};
  return key.section == "model" && std::find(std::begin(shape), std::end(shape), key.name) != std::end(shape);
}

// model.family = "llama" sets the architecture keys the deck leaves out to
// Llama's (a key given in the deck or with --set wins); gpt2's are the
// struct's defaults. `given` says whether a key was given.
template <class Given>
void apply_family_defaults(Config& cfg, const Given& given) {
  ModelConfig& m = cfg.model;
  if (m.family != ModelFamily::llama) return;
  auto set = [&](const char* key, auto ModelConfig::*field, auto value) {
    if (given(std::string("model.") + key)) return;
    m.*field = value;
    cfg.key_origin[std::string("model.") + key] = "model.family";
  };
  set("norm", &ModelConfig::norm, NormKind::rmsnorm);
  set("position", &ModelConfig::position, PositionKind::rope);
  set("mlp", &ModelConfig::mlp, MlpKind::swiglu);
  set("bias", &ModelConfig::bias, false);
  set("tie_embeddings", &ModelConfig::tie_embeddings, false);
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(const std::string& wrong, const std::vector<std::string>& valid) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& v : valid) {
    const std::size_t d = edit_distance(wrong, v);
    if (d < best_d) best_d = d, best = v;
  }
  return best;
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::string:
      return "string";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    default:
      return "date/time";
  }
}

// An integer is accepted where a float is expected (lr = 1 is fine).
bool type_matches(const Key& key, const toml::node& n) {
  const std::string t = type_name(n);
  return t == key.type || (key.type == "float" && t == "integer");
}

// An unknown section or key named by `where` (a --set), with the nearest valid one.
void require_known_key(const std::string& section, const std::string& name, const std::string& where) {
  std::vector<std::string> sections, dotted;
  for (const auto& k : schema()) {
    if (std::find(sections.begin(), sections.end(), k.section) == sections.end()) sections.push_back(k.section);
    dotted.push_back(k.dotted());
  }
  if (std::find(sections.begin(), sections.end(), section) == sections.end())
    throw Error(where + ": unknown section [" + section + "]; did you mean [" + nearest(section, sections) + "]?");
  const std::string full = section + "." + name;
  if (std::find(dotted.begin(), dotted.end(), full) == dotted.end())
    throw Error(where + ": unknown key " + full + "; did you mean " + nearest(full, dotted) + "?");
}

// "--set section.key=value": the value is parsed as TOML, and taken as a bare
// string when it is not valid TOML (so --set data.source=text works).
void apply_override(toml::table& deck, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  require(eq != std::string::npos && dot != std::string::npos && dot < eq,
          "--set '" + assignment + "': expected section.key=value, e.g. --set train.steps=100");
  const std::string section = assignment.substr(0, dot);
  const std::string name = assignment.substr(dot + 1, eq - dot - 1);
  const std::string value = assignment.substr(eq + 1);
  require_known_key(section, name, "--set " + assignment);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};
  }
  // A string key takes the bare text even where it reads as another TOML
  // value: --set fault.kind=nan is the string "nan", not the float NaN.
  const bool string_key = std::any_of(schema().begin(), schema().end(), [&](const Key& k) {
    return k.section == section && k.name == name && k.type == "string";
  });
  if (string_key && !parsed.get("v")->is_string()) parsed = toml::table{{"v", value}};
  if (!deck.contains(section)) deck.insert(section, toml::table{});
  toml::table* sec = deck[section].as_table();
  require(sec != nullptr, "--set '" + assignment + "': [" + section + "] is not a section");
  sec->insert_or_assign(name, *parsed.get("v"));
}

void check_known_keys(const toml::table& deck, const std::string& origin) {
  std::vector<std::string> sections, dotted;
  for (const auto& k : schema()) {
    if (std::find(sections.begin(), sections.end(), k.section) == sections.end()) sections.push_back(k.section);
    dotted.push_back(k.dotted());
  }
  for (const auto& [sec_name, sec_node] : deck) {
    const std::string sec(sec_name.str());
    if (std::find(sections.begin(), sections.end(), sec) == sections.end())
      throw Error(origin + ": unknown section [" + sec + "]; did you mean [" + nearest(sec, sections) + "]?");
    const toml::table* table = sec_node.as_table();
    require(table != nullptr, origin + ": '" + sec + "' must be a section ([" + sec + "]), not a value");
    for (const auto& [key_name, node] : *table) {
      const std::string full = sec + "." + std::string(key_name.str());
      if (std::find(dotted.begin(), dotted.end(), full) == dotted.end())
        throw Error(origin + ": unknown key " + full + "; did you mean " + nearest(full, dotted) + "?");
    }
  }
}

// comm.timeout_s, seconds (0 disables the deadline).
constexpr double kMinCommTimeout = 0.1;
constexpr double kMaxCommTimeout = 7 * 24 * 3600.0;

void check_range(bool ok, const std::string& origin, const std::string& key, const std::string& value,
                 const std::string& rule) {
  if (!ok) throw Error(origin + ": " + key + " = " + value + " is out of range: " + rule);
}

// [fault]: every setting must be one that fires; a fault that can never fire
// would let a test pass without testing anything.
void validate_fault(const Config& c, const std::string& origin) {
  const FaultConfig& f = c.fault;
  const std::string kind = "\"" + std::string(name_of(f.kind)) + "\"";
  const bool every_rank = f.kind == FaultKind::skip_collective && f.rank == -1;
  check_range(f.rank >= 0 || every_rank, origin, "fault.rank", std::to_string(f.rank),
              "must be >= 0 (a world rank), or -1 (every rank) with fault.kind = \"skip_collective\"");
  check_range(f.step >= 0, origin, "fault.step", std::to_string(f.step), "must be >= 0");
  const bool sums = f.group == "tp" || f.group == "fsdp" || f.group == "dp_replicate" || f.group == "tied_wte" ||
                    f.group == "efsdp" || f.group == "batch" || f.group == "norm";
  check_range(sums, origin, "fault.group", "\"" + f.group + "\"",
              "must name a communicator that sums: \"tp\", \"fsdp\", \"dp_replicate\", \"tied_wte\", \"efsdp\", "
              "\"batch\" or \"norm\" (cp, pp and ep only exchange)");
  require(every_rank || f.group == "batch",
          origin +
              ": fault.group applies to fault.kind = \"skip_collective\" with fault.rank = -1 (every rank); "
              "remove it");
  if (f.kind == FaultKind::none) return;
  const int steps = c.train.steps;
  const bool in_save = f.phase.has_value();
  if (f.kind == FaultKind::enospc)
    require(in_save, origin + ": fault.kind = \"enospc\" needs fault.phase (the phase of the save to fail: " +
                         choices_text(kSavePhaseNames) + ")");
  if (f.kind == FaultKind::nan || f.kind == FaultKind::skip_collective)
    require(!in_save, origin + ": fault.phase applies to saves (fault.kind = \"enospc\" or \"kill\"), not to " +
                          "fault.kind = " + kind + "; remove it");
  if (in_save) {
    const auto& k = c.checkpoint;
    const bool saved =
        (k.every > 0 && f.step > 0 && f.step % k.every == 0 && f.step <= steps) || (k.at_start && f.step == 0);
    check_range(saved, origin, "fault.step", std::to_string(f.step),
                "no checkpoint of that step is saved (checkpoint.every = " + std::to_string(k.every) +
                    ", checkpoint.at_start = " + (k.at_start ? "true" : "false") +
                    ", train.steps = " + std::to_string(steps) + "), so the fault would never fire");
  } else if (f.kind == FaultKind::nan && f.step == steps) {
    // The final state's forward check (it runs when the final state is saved).
    const auto& k = c.checkpoint;
    check_range(k.every > 0 && steps % k.every == 0, origin, "fault.step", std::to_string(f.step),
                "is train.steps, whose state is checked only when it is saved (checkpoint.every dividing "
                "train.steps), so the fault would never fire");
  } else {
    check_range(f.step < steps, origin, "fault.step", std::to_string(f.step),
                "must be below train.steps = " + std::to_string(steps) + ", or the fault would never fire");
  }
}

void validate_architecture(const ModelConfig& m, const std::string& origin) {
  auto s = [](auto v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  check_range(m.norm_eps > 0 && m.norm_eps < 1, origin, "model.norm_eps", s(m.norm_eps), "must be in (0, 1)");
  check_range(m.rope_theta > 1, origin, "model.rope_theta", s(m.rope_theta),
              "must be above 1 (the base of the rotation's wavelengths; Llama 3 uses 500000)");
  if (m.position == PositionKind::rope)
    check_range(m.head_size() % 2 == 0, origin, "model.channels", s(m.channels),
                "/ model.heads = " + s(m.head_size()) + " must be even for model.position = \"rope\" (it rotates " +
                    "pairs of a head's channels)");
  check_range(m.ffn_hidden >= 0, origin, "model.ffn_hidden", s(m.ffn_hidden), "must be >= 0 (0: 4 x model.channels)");
  require(m.mlp != MlpKind::swiglu || m.ffn_hidden > 0,
          origin + ": model.mlp = \"swiglu\" needs model.ffn_hidden (its hidden width; Llama 3 8B uses 14336 for " +
              "4096 channels)");
  check_range(m.kv_heads >= 0, origin, "model.kv_heads", s(m.kv_heads), "must be >= 0 (0: model.heads)");
  check_range(m.kv_heads == 0 || m.heads % m.kv_heads == 0, origin, "model.kv_heads", s(m.kv_heads),
              "must divide model.heads = " + s(m.heads) + " (each key/value head serves a whole group of query heads)");
}

// Mixture-of-Experts (docs/model.md): the rules the deck alone decides; the
// split over the mesh (ep dividing dp_shard x cp x tp, sequence parallelism
// under tp) is checked once the degrees are resolved (model/moe.hpp).
void validate_moe(const Config& c, const std::string& origin) {
  const ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  auto s = [](auto v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  check_range(m.moe_experts >= 0, origin, "model.moe_experts", s(m.moe_experts),
              "must be >= 0 (0: a dense model, no MoE block)");
  // Negative rates would push the router away from balance (bias) or reward
  // imbalance (aux, z-loss); a bound below 1 is below the mean load itself.
  check_range(t.moe_bias_rate >= 0, origin, "train.moe_bias_rate", s(t.moe_bias_rate),
              "must be >= 0 (0: no balancing bias)");
  check_range(t.moe_seq_aux >= 0, origin, "train.moe_seq_aux", s(t.moe_seq_aux),
              "must be >= 0 (0: no sequence balance loss)");
  check_range(t.moe_z_loss >= 0, origin, "train.moe_z_loss", s(t.moe_z_loss), "must be >= 0 (0: no router z-loss)");
  check_range(c.perf.moe_imbalance >= 1, origin, "perf.moe_imbalance", s(c.perf.moe_imbalance),
              "must be >= 1 (the busiest rank's routed tokens over the mean; 1: balanced)");
  check_range(t.moe_max_load == 0 || t.moe_max_load >= 1, origin, "train.moe_max_load", s(t.moe_max_load),
              "must be 0 (the worst case, moe_experts / moe_top_k) or >= 1 (a multiple of the mean load, which "
              "the busiest expert always reaches)");
  const int ep = c.parallel.ep;
  check_range(ep >= 1, origin, "parallel.ep", s(ep), "must be a degree >= 1");
  if (!m.moe()) {
    check_range(ep == 1, origin, "parallel.ep", s(ep),
                "needs experts to split: set model.moe_experts (a multiple of parallel.ep), or parallel.ep = 1");
    return;
  }
  check_range(m.moe_top_k >= 1 && m.moe_top_k <= m.moe_experts, origin, "model.moe_top_k", s(m.moe_top_k),
              "must be between 1 and model.moe_experts = " + s(m.moe_experts) + " (the experts each token is sent to)");
  check_range(m.moe_every >= 1, origin, "model.moe_every", s(m.moe_every),
              "must be at least 1 (1: every block from model.moe_dense_first on is an MoE block)");
  check_range(m.moe_dense_first >= 0, origin, "model.moe_dense_first", s(m.moe_dense_first), "must be >= 0");
  check_range(m.moe_blocks() > 0, origin, "model.moe_dense_first", s(m.moe_dense_first),
              "leaves no MoE block among the " + s(m.layers) + " layers (model.moe_every = " + s(m.moe_every) +
                  "); lower it, or set model.moe_experts = 0 for a dense model");
  check_range(m.moe_hidden >= 0, origin, "model.moe_hidden", s(m.moe_hidden),
              "must be >= 0 (0: the dense MLP's width)");
  check_range(m.moe_shared_hidden >= 0, origin, "model.moe_shared_hidden", s(m.moe_shared_hidden),
              "must be >= 0 (0: no shared expert)");
  require(t.moe_bias_rate == 0 || m.moe_score == MoeScore::sigmoid,
          origin + ": train.moe_bias_rate = " + s(t.moe_bias_rate) +
              " applies to model.moe_score = \"sigmoid\" (DeepSeek-V3's selection bias); set model.moe_score = "
              "\"sigmoid\" or train.moe_bias_rate = 0");
  check_range(m.moe_experts % ep == 0, origin, "model.moe_experts", s(m.moe_experts),
              "must be a multiple of parallel.ep = " + s(ep) + " (each ep rank holds the same number of experts)");
}

void validate(const Config& c, const std::string& origin) {
  const auto& m = c.model;
  const auto& t = c.train;
  auto s = [](auto v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  check_range(m.layers >= 1, origin, "model.layers", s(m.layers), "must be at least 1");
  check_range(m.channels >= 1, origin, "model.channels", s(m.channels), "must be at least 1");
  check_range(m.heads >= 1, origin, "model.heads", s(m.heads), "must be at least 1");
  check_range(m.vocab >= 2, origin, "model.vocab", s(m.vocab), "must be at least 2");
  check_range(m.seq_len >= 1, origin, "model.seq_len", s(m.seq_len), "must be at least 1");
  check_range(m.channels % m.heads == 0, origin, "model.channels", s(m.channels),
              "must be divisible by model.heads = " + s(m.heads));
  validate_architecture(m, origin);
  validate_moe(c, origin);
  check_range(t.steps >= 0, origin, "train.steps", s(t.steps), "must be >= 0");
  check_range(t.global_batch >= 1, origin, "train.global_batch", s(t.global_batch), "must be at least 1");
  check_range(t.micro_batch >= 1, origin, "train.micro_batch", s(t.micro_batch), "must be at least 1");
  check_range(t.global_batch % t.micro_batch == 0, origin, "train.global_batch", s(t.global_batch),
              "must be a multiple of train.micro_batch = " + s(t.micro_batch));
  check_range(t.lr > 0 && t.lr < 10, origin, "train.lr", s(t.lr), "must be in (0, 10)");
  check_range(t.min_lr >= 0 && t.min_lr <= t.lr, origin, "train.min_lr", s(t.min_lr),
              "must be in [0, train.lr = " + s(t.lr) + "]");
  check_range(t.warmup_steps >= 0, origin, "train.warmup_steps", s(t.warmup_steps), "must be >= 0");
  // AdamW shrinks every 2-D weight by lr x weight_decay per step: above 1
  // that would flip its sign, and far below it the run only diverges.
  check_range(t.weight_decay >= 0 && t.weight_decay <= 1, origin, "train.weight_decay", s(t.weight_decay),
              "must be in [0, 1]");
  check_range(t.grad_clip >= 0, origin, "train.grad_clip", s(t.grad_clip), "must be >= 0 (0 disables clipping)");
  check_range(t.log_every >= 1, origin, "train.log_every", s(t.log_every), "must be at least 1");
  const auto& d = c.data;
  check_range(d.source == "synthetic" || d.source == "text" || d.source == "tokens", origin, "data.source",
              "\"" + d.source + "\"", "must be \"synthetic\", \"text\" or \"tokens\"");
  if (d.source != "synthetic")
    require(!d.path.empty(), origin + ": data.source = \"" + d.source + "\" needs data.path (the file to read)");
  check_range(d.val_fraction >= 0 && d.val_fraction < 1, origin, "data.val_fraction", s(d.val_fraction),
              "must be in [0, 1) (0: no tokens held out of data.path)");
  if (d.source == "synthetic") {
    require(d.val_path.empty(), origin + ": data.val_path applies to data.source = \"text\" or \"tokens\"; the " +
                                    "synthetic source holds out a validation stream of its own; remove it");
    require(d.val_fraction == 0, origin + ": data.val_fraction applies to data.source = \"text\" or \"tokens\"; " +
                                     "the synthetic source holds out a validation stream of its own; remove it");
  }
  require(d.val_path.empty() || d.val_fraction == 0,
          origin + ": data.val_path and data.val_fraction both name held-out data; set one of them");
  check_range(t.eval_every >= 0, origin, "train.eval_every", s(t.eval_every), "must be >= 0 (0: no validation loss)");
  check_range(t.eval_batches >= 1, origin, "train.eval_batches", s(t.eval_batches), "must be at least 1");
  if (t.eval_every > 0 && d.source != "synthetic")
    require(!d.val_path.empty() || d.val_fraction > 0,
            origin + ": train.eval_every = " + s(t.eval_every) + " needs held-out data for data.source = \"" +
                d.source + "\": set data.val_path (a separate file) or data.val_fraction (the end of data.path)");
  if (d.source == "text")
    check_range(m.vocab == 256, origin, "model.vocab", s(m.vocab), "must be 256 for data.source = \"text\" (bytes)");
  const auto& p = c.parallel;
  for (auto [name, v] : {std::pair{"dp_replicate", p.dp_replicate}, std::pair{"dp_shard", p.dp_shard},
                         std::pair{"tp", p.tp}, std::pair{"cp", p.cp}, std::pair{"pp", p.pp}})
    check_range(v == -1 || v >= 1, origin, std::string("parallel.") + name, s(v),
                "must be a degree >= 1, or -1 for what is left of the world");
  check_range(p.virtual_stages >= 1, origin, "parallel.virtual_stages", s(p.virtual_stages), "must be at least 1");
  const auto& k = c.checkpoint;
  check_range(k.every >= 0, origin, "checkpoint.every", s(k.every), "must be >= 0 (0: never)");
  check_range(k.keep >= 1, origin, "checkpoint.keep", s(k.keep), "must be at least 1");
  require(!k.dir.empty(), origin + ": checkpoint.dir must not be empty");
  // Below 0.1 s a healthy collective would count as a hang; beyond a week no
  // job runs, and a deadline of now + 1e300 s overflows the clock.
  const double timeout = c.comm.timeout_s;
  check_range(timeout == 0 || (timeout >= kMinCommTimeout && timeout <= kMaxCommTimeout), origin, "comm.timeout_s",
              s(timeout),
              "must be 0 (no deadline) or between " + s(kMinCommTimeout) + " and " + s(kMaxCommTimeout) +
                  " seconds (one week)");
  check_range(c.comm.progress_poll_us >= 0 && c.comm.progress_poll_us <= 1e6, origin, "comm.progress_poll_us",
              s(c.comm.progress_poll_us), "must be between 0 (no progress thread) and 1e6 microseconds");
  // bf16 reductions round the gradients: an fp32 run would silently stop being exact.
  require(c.comm.reduce_dtype == Precision::fp32 || t.precision == Precision::bf16,
          origin +
              ": comm.reduce_dtype = \"bf16\" needs train.precision = \"bf16\" (an fp32 run reduces its "
              "gradients in fp32); set train.precision = \"bf16\" or comm.reduce_dtype = \"fp32\"");
  check_range(c.perf.peak_gflops >= 0, origin, "perf.peak_gflops", s(c.perf.peak_gflops),
              "must be >= 0 (0: measure with a GEMM calibration)");
#ifndef NDMINI_HAVE_ONEDNN
  require(c.perf.gemm_route != GemmRoute::onednn,
          origin +
              ": perf.gemm_route = \"onednn\": this build has no oneDNN; set perf.gemm_route = \"auto\" or "
              "\"blas\" (or rebuild with oneDNN)");
#endif
  check_range(c.perf.memory_per_rank_gib >= 0, origin, "perf.memory_per_rank_gib", s(c.perf.memory_per_rank_gib),
              "must be >= 0 (0: the node's available memory divided by its ranks)");
  validate_fault(c, origin);
}

// The resolved deck as TOML: toml++ writes every value but floats, which it
// writes with 17 significant digits (lr = 0.00059999999999999995); a float
// is written in its shortest exact form instead, so the deck reads as it was
// written and still parses back to the same bits (checkpoints store it).
std::string deck_text(const toml::table& deck) {
  std::ostringstream out;
  bool first_section = true;
  for (const auto& [sec_name, sec_node] : deck) {
    out << (first_section ? "" : "\n\n") << "[" << sec_name.str() << "]";
    first_section = false;
    for (const auto& [key_name, node] : *sec_node.as_table()) {
      out << "\n" << key_name.str() << " = ";
      if (node.is_floating_point())
        out << shortest_float(*node.value<double>());
      else
        node.visit([&](const auto& v) { out << v; });
    }
  }
  return out.str();
}

}  // namespace

std::string shortest_float(double v) {
  if (std::isnan(v)) return "nan";  // TOML's spelling; the sign of a NaN is not kept
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  // std::to_chars without a format or precision: the shortest text that
  // reads back as v (fixed or scientific, whichever is shorter).
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string text(buf, ec == std::errc() ? end : buf);
  // "3" would read back as an integer: keep it a float.
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

Config parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides) {
  toml::table deck;
  try {
    deck = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": not valid TOML: " << e.description();
    throw Error(os.str());
  }
  // The deck's own keys first, so a typo is reported where it was made.
  check_known_keys(deck, origin);
  Config cfg;
  for (const auto& key : schema())
    if (deck.at_path(key.dotted()).node() != nullptr) cfg.key_origin[key.dotted()] = "deck";
  for (const auto& o : overrides) {
    apply_override(deck, o);
    cfg.key_origin[o.substr(0, o.find('='))] = "--set";
  }

  for (const auto& key : schema()) {
    const toml::node* node = deck.at_path(key.dotted()).node();
    if (node == nullptr) {
      require(!required(key), origin + ": missing required key " + key.dotted() + " (the model's shape)");
      continue;
    }
    if (!type_matches(key, *node))
      throw Error(origin + ": " + key.dotted() + " must be " + (key.type == "integer" ? "an " : "a ") + key.type +
                  ", got a " + type_name(*node));
    if (key.type == "integer") {
      const std::int64_t value = *node->value<std::int64_t>();
      if (value < key.min_int || value > key.max_int)
        throw Error(origin + ": " + key.dotted() + " = " + std::to_string(value) + " does not fit: must be between " +
                    std::to_string(key.min_int) + " and " + std::to_string(key.max_int));
    }
    if (key.broken_rule) {
      const std::string value = *node->value<std::string>();
      const std::string rule = key.broken_rule(value);
      if (!rule.empty()) check_range(false, origin, key.dotted(), "\"" + value + "\"", rule);
    }
    key.store(cfg, *node);
  }
  apply_family_defaults(cfg, [&](const std::string& key) { return deck.at_path(key).node() != nullptr; });
  // At most one degree is -1: one set to -1 in the deck fills the world, not dp_shard's default.
  auto& par = cfg.parallel;
  if (deck.at_path("parallel.dp_shard").node() == nullptr &&
      (par.pp == -1 || par.dp_replicate == -1 || par.cp == -1 || par.tp == -1))
    par.dp_shard = 1;
  validate(cfg, origin);
  cfg.toml = deck_text(deck);
  return cfg;
}

std::vector<DeckKey> deck_keys() {
  const Config defaults;
  std::vector<DeckKey> keys;
  for (const auto& k : schema()) keys.push_back({k.section, k.name, k.type, required(k) ? "" : k.show(defaults)});
  return keys;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  const FileUse deck{"deck '" + path + "'", "name a .toml file (e.g. inputs/tiny.toml)"};
  return parse_config(read_small_file(path, kDeckMaxBytes, deck), path, overrides);
}

std::vector<KeyValue> key_values(const Config& cfg) {
  std::vector<KeyValue> out;
  for (const auto& k : schema()) out.push_back({k.dotted(), k.show(cfg)});
  return out;
}

std::string effective_toml(const Config& cfg) {
  std::string text, section;
  for (const auto& k : schema()) {
    if (k.section != section) {
      text += (section.empty() ? "[" : "\n[") + k.section + "]\n";
      section = k.section;
    }
    text += k.name + " = " + k.show(cfg) + "\n";
  }
  return text;
}

std::string effective_toml_with_origins(const Config& cfg, const Config& resolved) {
  std::size_t width = 0;
  for (const auto& k : schema()) width = std::max(width, k.name.size() + 3 + k.show(resolved).size());
  std::string text, section;
  for (const auto& k : schema()) {
    if (k.section != section) {
      text += (section.empty() ? "[" : "\n[") + k.section + "]\n";
      section = k.section;
    }
    const std::string line = k.name + " = " + k.show(resolved);
    const auto origin = cfg.key_origin.find(k.dotted());
    std::string from = origin == cfg.key_origin.end() ? "default" : origin->second;
    if (k.show(cfg) != k.show(resolved)) from += " (" + k.show(cfg) + ", resolved)";
    text += line + std::string(width - line.size() + 2, ' ') + "# " + from + "\n";
  }
  return text;
}

}  // namespace ndmini
