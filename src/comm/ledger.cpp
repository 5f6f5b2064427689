// SPDX-License-Identifier: BSD-3-Clause
// The collective ledger, the CollectiveWatchdog, and the diagnosis of a hang
// (see ledger.hpp for the protocol).
#include "comm/ledger.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace ndmini {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

struct CommInfo {
  std::string name;
  std::vector<int> world_ranks;
};
std::vector<CommInfo>& registry() {
  static std::vector<CommInfo> comms;
  return comms;
}

struct Ledger {
  std::array<LedgerEntry, kLedgerSize> ring;
  std::uint64_t next = 0;
};
Ledger& ledger() {
  static Ledger l;
  return l;
}

// The watchdog alive in this process (at most one).
struct Watch {
  MPI_Comm diag = MPI_COMM_NULL;  // a duplicate of the world: diagnosis traffic never meets the job's
  int rank = 0, size = 1;
  double timeout_s = 0;
  Watch* outer = nullptr;  // the watchdog this one hides while alive (a train() inside a watched program)
};
Watch* g_watch = nullptr;
bool g_diagnosing = false;

constexpr int kAlarmTag = 1;
constexpr int kReportTag = 2;
constexpr std::size_t kPrintedEntries = 8;  // of its ledger, each answering rank prints the last few
// Answering takes milliseconds, or a scheduling delay on a busy node; a rank
// that has not answered within the grace is taken as not inside the comm layer.
constexpr double kMinGraceS = 2.0;
constexpr double kMaxGraceS = 10.0;

double grace_s(double timeout_s) { return std::min(kMaxGraceS, std::max(kMinGraceS, timeout_s)); }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string group_text(const std::vector<int>& ranks) {
  std::string out = "[";
  constexpr std::size_t kMaxShown = 16;
  for (std::size_t i = 0; i < ranks.size() && i < kMaxShown; ++i) out += (i ? " " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kMaxShown) out += " ... " + std::to_string(ranks.back());
  return out + "]";
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank" : "ranks";
  for (int r : ranks) out += " " + std::to_string(r);
  return out;
}

// --- Reports: one rank's ledger as text, sent to the coordinator -----------

struct Report {
  int rank = 0;
  std::int64_t waiting = -1;  // ledger index of the collective it waits in; -1: none
  double waited_s = 0;
  std::map<int, CommInfo> comms;
  std::vector<LedgerEntry> entries;  // oldest first

  const LedgerEntry* entry(std::uint64_t index) const {
    for (const auto& e : entries)
      if (e.index == index) return &e;
    return nullptr;
  }
  const CommInfo& comm(int id) const {
    static const CommInfo unknown{"?", {}};
    auto it = comms.find(id);
    return it == comms.end() ? unknown : it->second;
  }
  // "'dp' #5 (all_reduce, 4096 B)"
  std::string describe(const LedgerEntry& e) const {
    return "'" + comm(e.comm).name + "' #" + std::to_string(e.seq) + " (" + coll_op_name(e.op) + ", " +
           std::to_string(e.bytes) + " B)";
  }
  // Identity of a communicator across ranks: its name and its world ranks.
  std::string key(const LedgerEntry& e) const {
    const CommInfo& c = comm(e.comm);
    return c.name + group_text(c.world_ranks);
  }
  // What SPMD ranks agree on at each position: the axis, operation and size
  // (not the group: the two dp groups of a 4-rank job are different groups).
  std::string signature(const LedgerEntry& e) const {
    return comm(e.comm).name + "/" + coll_op_name(e.op) + "/" + std::to_string(e.bytes);
  }
};

std::string serialize(int rank, std::int64_t waiting, double waited_s) {
  std::ostringstream os;
  os << "R " << rank << ' ' << waiting << ' ' << waited_s << '\n';
  const auto entries = ledger_entries();
  std::set<int> used;
  for (const auto& e : entries) used.insert(e.comm);
  // Groups in ranks of the watchdog's communicator (the world, unless a
  // caller watches a sub-communicator); -1 for ranks outside it.
  MPI_Group world = MPI_GROUP_NULL, diag = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Comm_group(g_watch->diag, &diag);
  for (int id : used) {
    const CommInfo& c = registry()[id];
    std::string name = c.name;
    std::replace(name.begin(), name.end(), ' ', '_');
    std::vector<int> ranks(c.world_ranks.size());
    MPI_Group_translate_ranks(world, static_cast<int>(ranks.size()), c.world_ranks.data(), diag, ranks.data());
    os << "C " << id << ' ' << name << ' ' << ranks.size();
    for (int r : ranks) os << ' ' << (r == MPI_UNDEFINED ? -1 : r);
    os << '\n';
  }
  MPI_Group_free(&world);
  MPI_Group_free(&diag);
  for (const auto& e : entries)
    os << "E " << e.index << ' ' << e.seq << ' ' << e.comm << ' ' << static_cast<int>(e.op) << ' ' << e.blocking << ' '
       << e.complete << ' ' << e.bytes << '\n';
  return os.str();
}

Report parse(const std::string& text) {
  Report r;
  std::istringstream in(text);
  std::string kind;
  while (in >> kind) {
    if (kind == "R") {
      in >> r.rank >> r.waiting >> r.waited_s;
    } else if (kind == "C") {
      int id = 0;
      std::size_t n = 0;
      CommInfo c;
      in >> id >> c.name >> n;
      c.world_ranks.resize(n);
      for (auto& w : c.world_ranks) in >> w;
      r.comms[id] = c;
    } else if (kind == "E") {
      LedgerEntry e;
      int op = 0;
      in >> e.index >> e.seq >> e.comm >> op >> e.blocking >> e.complete >> e.bytes;
      e.op = static_cast<CollOp>(op);
      r.entries.push_back(e);
    }
  }
  return r;
}

// --- The verdict --------------------------------------------------------------

// The first position (in each rank's own order of collectives) at which the
// answering ranks disagree; ranks issuing the same program agree everywhere.
std::vector<std::string> first_divergence(const std::map<int, Report>& reports) {
  std::uint64_t lo = 0, hi = 0;
  bool any = false;
  for (const auto& [rank, r] : reports) {
    if (r.entries.empty()) continue;
    lo = std::max(lo, r.entries.front().index);
    hi = std::max(hi, r.entries.back().index);
    any = true;
  }
  if (!any) return {"no rank has issued a collective yet"};
  for (std::uint64_t g = lo; g <= hi; ++g) {
    std::map<std::string, std::vector<int>> by_signature;
    std::map<std::string, std::string> shown;  // signature -> description from its first rank
    std::vector<int> stopped;
    for (const auto& [rank, r] : reports) {
      const LedgerEntry* e = r.entry(g);
      if (e == nullptr) {
        stopped.push_back(rank);
        continue;
      }
      const std::string sig = r.signature(*e);
      by_signature[sig].push_back(rank);
      if (!shown.count(sig)) shown[sig] = r.describe(*e);
    }
    if (by_signature.size() <= 1 && stopped.empty()) continue;
    const std::string at = "collective #" + std::to_string(g) + " of each rank";
    if (by_signature.size() <= 1) {
      // Some ranks went on to #g, others stopped before it.
      std::string line = "first divergence at " + at + ": " + ranks_text(stopped) + " stopped before it";
      for (int s : stopped) {
        const Report& r = reports.at(s);
        const LedgerEntry* w = r.waiting >= 0 ? r.entry(static_cast<std::uint64_t>(r.waiting)) : nullptr;
        if (w != nullptr) line += " (rank " + std::to_string(s) + " waits in " + r.describe(*w) + ")";
      }
      if (!by_signature.empty())
        line += "; " + ranks_text(by_signature.begin()->second) + " issued " + shown[by_signature.begin()->first];
      return {line};
    }
    // The majority is the reference; without one, the lowest rank's collective.
    std::string reference;
    std::size_t best = 0;
    int best_low = 1 << 30;
    for (const auto& [sig, ranks] : by_signature) {
      if (ranks.size() > best || (ranks.size() == best && ranks.front() < best_low)) {
        best = ranks.size();
        best_low = ranks.front();
        reference = sig;
      }
    }
    bool tie = false;
    for (const auto& [sig, ranks] : by_signature) tie |= sig != reference && ranks.size() == best;
    std::vector<std::string> lines;
    for (const auto& [sig, ranks] : by_signature) {
      if (sig == reference) continue;
      lines.push_back("first divergence at " + at + ": " + ranks_text(ranks) + " issued " + shown[sig] + " where " +
                      ranks_text(by_signature[reference]) + " issued " + shown[reference] +
                      (tie ? " (no majority: the lowest rank's collective is taken as the reference)" : ""));
    }
    return lines;
  }
  return {"the ledgers agree: every answering rank issued the same collectives (up to #" + std::to_string(hi) +
          "); a peer that is slow rather than divergent, or a stuck transport, or comm.timeout_s too short"};
}

// Who waits in what, and which members of that group have not issued it.
std::vector<std::string> waits(const std::map<int, Report>& reports, int world) {
  struct Wait {
    std::string what;
    std::vector<int> waiting;
    std::vector<int> members;
    std::uint64_t seq = 0;
  };
  std::map<std::string, Wait> by_collective;
  for (const auto& [rank, r] : reports) {
    if (r.waiting < 0) continue;
    const LedgerEntry* e = r.entry(static_cast<std::uint64_t>(r.waiting));
    if (e == nullptr) continue;
    const std::string id = r.key(*e) + "#" + std::to_string(e->seq);
    Wait& w = by_collective[id];
    w.what = r.describe(*e) + " on " + group_text(r.comm(e->comm).world_ranks);
    w.waiting.push_back(rank);
    w.members = r.comm(e->comm).world_ranks;
    w.seq = e->seq;
  }
  std::vector<std::string> lines;
  for (const auto& [id, w] : by_collective) {
    const std::string key = id.substr(0, id.rfind('#'));
    std::string missing;
    for (int q : w.members) {
      if (std::find(w.waiting.begin(), w.waiting.end(), q) != w.waiting.end()) continue;
      auto it = reports.find(q);
      if (it == reports.end()) {
        missing += " rank " + std::to_string(q) + " (no answer);";
        continue;
      }
      // q's newest collective on this communicator.
      const Report& r = it->second;
      const LedgerEntry* last = nullptr;
      for (const auto& e : r.entries)
        if (r.key(e) == key) last = &e;
      if (last != nullptr && last->seq >= w.seq) continue;  // issued it: not what holds the group
      missing += " rank " + std::to_string(q) + " (its last there is " +
                 (last ? "#" + std::to_string(last->seq) : std::string("none in its ledger"));
      const LedgerEntry* own = r.waiting >= 0 ? r.entry(static_cast<std::uint64_t>(r.waiting)) : nullptr;
      if (own != nullptr) missing += "; it waits in " + r.describe(*own);
      missing += ");";
    }
    if (!missing.empty()) missing.pop_back();
    lines.push_back(w.what + ": " + ranks_text(w.waiting) + " wait" + (w.waiting.size() == 1 ? "s" : "") +
                    (missing.empty() ? "" : "; not issued by" + missing));
  }
  std::vector<int> silent;
  for (int q = 0; q < world; ++q)
    if (!reports.count(q)) silent.push_back(q);
  if (!silent.empty())
    lines.push_back("no answer from " + ranks_text(silent) +
                    ": not waiting in a collective of the comm layer (computing, blocked in another MPI call, "
                    "finished, or dead)");
  return lines;
}

void print_own(const std::string& text, int rank) {
  const Report r = parse(text);
  const std::size_t n = r.entries.size(), first = n > kPrintedEntries ? n - kPrintedEntries : 0;
  std::string out;
  char line[512];
  for (std::size_t i = first; i < n; ++i) {
    const LedgerEntry& e = r.entries[i];
    const bool waiting = r.waiting >= 0 && e.index == static_cast<std::uint64_t>(r.waiting);
    std::snprintf(line, sizeof line, "ndmini: rank %d ledger: #%llu %s on %s %s%s\n", rank,
                  static_cast<unsigned long long>(e.index), r.describe(e).c_str(),
                  group_text(r.comm(e.comm).world_ranks).c_str(), e.blocking ? "blocking" : "non-blocking",
                  waiting ? ", WAITING" : (e.complete ? ", complete" : ", in flight"));
    out += line;
  }
  if (n == 0) out = "ndmini: rank " + std::to_string(rank) + " ledger: empty\n";
  std::fputs(out.c_str(), stderr);
  std::fflush(stderr);
}

[[noreturn]] void end_job() {
  std::fflush(stdout);
  std::fflush(stderr);
  // The launcher forwards output through pipes it stops reading once a rank
  // aborts: give it a moment, or the diagnosis may be lost.
  constexpr auto kDrainOutput = std::chrono::milliseconds(500);
  std::this_thread::sleep_for(kDrainOutput);
  MPI_Abort(MPI_COMM_WORLD, kCollectiveTimeoutExit);
  std::abort();  // MPI_Abort does not return
}

// The diagnosis (ledger.hpp). `raised`: this rank's own deadline passed;
// otherwise `alarm_from` raised the alarm.
[[noreturn]] void diagnose(std::uint64_t waiting, double waited_s, bool raised, int alarm_from) {
  g_diagnosing = true;
  Watch& w = *g_watch;
  std::set<int> raisers;
  std::vector<MPI_Request> sends;
  static int alarm_payload;  // outlives the sends
  alarm_payload = w.rank;
  if (raised) {
    raisers.insert(w.rank);
    for (int q = 0; q < w.size; ++q) {
      if (q == w.rank) continue;
      sends.emplace_back();
      MPI_Isend(&alarm_payload, 1, MPI_INT, q, kAlarmTag, w.diag, &sends.back());
    }
  } else {
    raisers.insert(alarm_from);
  }
  const std::string mine = serialize(w.rank, waiting == kNoEntry ? -1 : static_cast<std::int64_t>(waiting), waited_s);
  print_own(mine, w.rank);

  std::set<int> told;  // coordinators sent this rank's report
  auto tell = [&](int q) {
    if (q == w.rank || told.count(q)) return;
    told.insert(q);
    sends.emplace_back();
    MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, q, kReportTag, w.diag, &sends.back());
  };
  tell(0);
  for (int q : raisers) tell(q);

  std::map<int, Report> reports;
  reports[w.rank] = parse(mine);
  const bool coordinator = w.rank == 0 || raised;
  const double grace = grace_s(w.timeout_s);
  const auto t0 = Clock::now();
  // Coordinators collect for the grace period (or until every rank answered);
  // the others answer late alarms until a coordinator ends the job.
  const double stay = coordinator ? grace : 2 * grace + kMaxGraceS;
  while (seconds_since(t0) < stay && !(coordinator && static_cast<int>(reports.size()) == w.size)) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kAlarmTag, w.diag, &flag, &st);
    if (flag) {
      int from = 0;
      MPI_Recv(&from, 1, MPI_INT, st.MPI_SOURCE, kAlarmTag, w.diag, MPI_STATUS_IGNORE);
      raisers.insert(from);
      tell(from);
    }
    if (coordinator) {
      MPI_Iprobe(MPI_ANY_SOURCE, kReportTag, w.diag, &flag, &st);
      if (flag) {
        int n = 0;
        MPI_Get_count(&st, MPI_CHAR, &n);
        std::string text(static_cast<std::size_t>(n), '\0');
        MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, kReportTag, w.diag, MPI_STATUS_IGNORE);
        reports[st.MPI_SOURCE] = parse(text);
      }
    }
    if (!sends.empty()) {
      int done = 0;
      MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE);
    }
    std::this_thread::yield();
  }
  // One verdict: rank 0's when it answered, otherwise the lowest raiser's.
  const bool speak = coordinator && (w.rank == 0 || (!reports.count(0) && w.rank == *raisers.begin()));
  if (!speak) {
    if (!coordinator) {
      std::fprintf(stderr, "ndmini: rank %d: no coordinator ended the job after the collective timeout; aborting\n",
                   w.rank);
    } else {
      // Rank 0 or a lower raiser gives the verdict; wait for it to end the job.
      const auto t1 = Clock::now();
      while (seconds_since(t1) < grace + kMaxGraceS) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    end_job();
  }

  std::vector<std::string> lines;
  std::vector<int> timed_out;
  for (const auto& [rank, r] : reports)
    if (r.waited_s >= w.timeout_s) timed_out.push_back(rank);
  char head[256];
  std::snprintf(head, sizeof head,
                "collective timeout: %s waited more than comm.timeout_s = %g s in a collective; %d of %d ranks "
                "answered the diagnosis",
                ranks_text(timed_out).c_str(), w.timeout_s, static_cast<int>(reports.size()), w.size);
  lines.push_back(head);
  for (auto& l : first_divergence(reports)) lines.push_back(std::move(l));
  for (auto& l : waits(reports, w.size)) lines.push_back(std::move(l));
  lines.push_back(
      "the ranks must issue the same collectives in the same order on every communicator; the job ends (exit " +
      std::to_string(kCollectiveTimeoutExit) + ") instead of hanging");
  std::string out;
  for (const auto& l : lines) out += "ndmini: " + l + "\n";
  std::fputs(out.c_str(), stderr);
  end_job();
}

}  // namespace

const char* coll_op_name(CollOp op) {
  switch (op) {
    case CollOp::all_reduce:
      return "all_reduce";
    case CollOp::all_gather:
      return "all_gather";
    case CollOp::reduce_scatter:
      return "reduce_scatter";
    case CollOp::broadcast:
      return "broadcast";
    case CollOp::send:
      return "send";
    case CollOp::recv:
      return "recv";
    case CollOp::p2p:
      return "p2p";
    case CollOp::all_reduce_scalar:
      return "all_reduce_scalar";
  }
  return "?";
}

int register_comm(MPI_Comm comm, const std::string& name) {
  CommInfo info{name, {}};
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> local(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) local[i] = i;
  info.world_ranks.resize(static_cast<std::size_t>(n));
  MPI_Group_translate_ranks(group, n, local.data(), world, info.world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  registry().push_back(std::move(info));
  return static_cast<int>(registry().size()) - 1;
}

const std::string& comm_name(int id) { return registry().at(static_cast<std::size_t>(id)).name; }

std::uint64_t ledger_record(int comm, std::uint64_t seq, CollOp op, std::int64_t bytes, bool blocking) {
  Ledger& l = ledger();
  const std::uint64_t index = l.next++;
  l.ring[index % kLedgerSize] = LedgerEntry{index, seq, comm, op, blocking, false, bytes};
  return index;
}

void ledger_complete(std::uint64_t index) {
  LedgerEntry& e = ledger().ring[index % kLedgerSize];
  if (e.index == index) e.complete = true;
}

std::vector<LedgerEntry> ledger_entries() {
  const Ledger& l = ledger();
  std::vector<LedgerEntry> out;
  const std::uint64_t first = l.next > kLedgerSize ? l.next - kLedgerSize : 0;
  for (std::uint64_t i = first; i < l.next; ++i) out.push_back(l.ring[i % kLedgerSize]);
  return out;
}

bool watch_alive() { return g_watch != nullptr; }

double watch_timeout_s() { return g_watch != nullptr && !g_diagnosing ? g_watch->timeout_s : 0.0; }

void watch_poll(std::uint64_t waiting, double waited_s) {
  if (g_watch == nullptr || g_diagnosing) return;
  int flag = 0;
  MPI_Status st;
  MPI_Iprobe(MPI_ANY_SOURCE, kAlarmTag, g_watch->diag, &flag, &st);
  if (!flag) return;
  int from = 0;
  MPI_Recv(&from, 1, MPI_INT, st.MPI_SOURCE, kAlarmTag, g_watch->diag, MPI_STATUS_IGNORE);
  diagnose(waiting, waited_s, false, from);
}

void watch_expired(std::uint64_t waiting, double waited_s) {
  if (g_watch == nullptr) {
    // Not reachable: without a watchdog there is no deadline.
    std::fprintf(stderr, "ndmini: collective timeout without a watchdog\n");
    end_job();
  }
  diagnose(waiting, waited_s, true, -1);
}

}  // namespace detail

// --- CollectiveWatchdog ---------------------------------------------------------

CollectiveWatchdog::CollectiveWatchdog(MPI_Comm world, double timeout_s) : timeout_s_(timeout_s) {
  require(timeout_s >= 0, "comm.timeout_s must be >= 0 seconds (0 disables hang detection)");
  auto w = std::make_unique<detail::Watch>();
  MPI_Comm_dup(world, &w->diag);
  MPI_Comm_rank(w->diag, &w->rank);
  MPI_Comm_size(w->diag, &w->size);
  w->timeout_s = timeout_s;
  w->outer = detail::g_watch;
  detail::g_watch = w.release();
}

CollectiveWatchdog::~CollectiveWatchdog() {
  detail::Watch* w = detail::g_watch;
  if (w == nullptr) return;
  detail::g_watch = w->outer;
  MPI_Comm_free(&w->diag);
  delete w;
}

}  // namespace ndmini
