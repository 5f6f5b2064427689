// SPDX-License-Identifier: BSD-3-Clause
// The collective ledger, the CollectiveWatchdog, and the diagnosis of a hang
// (see ledger.hpp for the protocol).
#include "comm/ledger.hpp"

#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi/mpi_calls.hpp"
#include "core/error.hpp"
#include "core/timer.hpp"

namespace ndmini {
namespace detail {
namespace {

struct CommInfo {
  std::string name;
  std::vector<int> world_ranks;
};
std::vector<CommInfo>& registry() {
  static std::vector<CommInfo> comms;
  return comms;
}

struct Ledger {
  std::mutex mutex;  // the main thread writes, the monitor thread reads
  std::array<LedgerEntry, kLedgerSize> ring;
  std::uint64_t next = 0;
};
Ledger& ledger() {
  static Ledger l;
  return l;
}

// The watchdog alive in this process (the newest governs; see CollectiveWatchdog).
struct Watch {
  MPI_Comm diag = MPI_COMM_NULL;  // a duplicate of the world: diagnosis traffic never meets the job's
  int rank = 0, size = 1;
  double timeout_s = 0;
  int peer_group = 0;        // ranks of one group issue the same collectives (set_peer_group)
  bool share_cores = false;  // waits_share_cores()
  Watch* outer = nullptr;    // the watchdog this one hides while alive (a train() inside a watched program)
  // The monitor thread (MPI_THREAD_MULTIPLE only), stopped by the destructor.
  std::thread monitor;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
};
std::atomic<Watch*> g_watch{nullptr};
std::atomic<bool> g_diagnosing{false};

// The wait the main thread is in (WaitScope), for the monitor thread.
struct CurrentWait {
  std::mutex mutex;
  std::uint64_t index = kNoEntry;
  Clock::time_point start{};
};
CurrentWait& current_wait() {
  static CurrentWait w;
  return w;
}
// {ledger index, seconds waited}; {kNoEntry, 0} when not waiting.
std::pair<std::uint64_t, double> wait_now() {
  CurrentWait& w = current_wait();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.index == kNoEntry) return {kNoEntry, 0.0};
  return {w.index, seconds_since(w.start)};
}

// The monitor thread looks at the wait and for alarms this often.
constexpr auto kMonitorTick = std::chrono::milliseconds(10);
// A polling wait (no monitor thread) looks for alarms this often.
constexpr auto kAlarmPoll = std::chrono::milliseconds(1);

constexpr int kAlarmTag = 1;
constexpr int kReportTag = 2;
constexpr std::size_t kPrintedEntries = 8;  // of its ledger, each answering rank prints the last few
// With a monitor thread every live rank answers within a tick or a
// scheduling delay on a busy node: a rank silent for the grace is stalled
// (stopped, dead, or blocked where its monitor cannot run). Without one, a
// rank answers only from inside a wait, so a computing rank needs longer.
constexpr double kGraceS = 2.0;
constexpr double kMaxGraceS = 10.0;

double grace_s(const Watch& w) {
  return w.monitor.joinable() ? kGraceS : std::min(kMaxGraceS, std::max(kGraceS, w.timeout_s));
}

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

}  // namespace

std::string spmd_signature(const std::string& comm_name, const LedgerEntry& e, const std::string& what) {
  const std::string head = comm_name + "/" + coll_op_name(e.op) + what;
  // An all-to-all-v moves what each rank's data asks for (tokens routed to
  // experts): its peers differ in bytes by design, so only the call is compared.
  if (e.op == CollOp::all_to_all_v) return head;
  return head + "/" + std::to_string(e.bytes);
}

namespace {

// --- Reports: one rank's ledger as text, sent to the coordinator -----------

struct Report {
  int rank = 0;
  std::int64_t waiting = -1;  // ledger index of the collective it waits in; -1: none
  double waited_s = 0;
  int peer_group = 0;
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
  // "'dp' #5 (all_reduce, 4096 B)"; a raw call adds its purpose:
  // "'world' #9 (all_reduce: the step agreement, 4 B)"
  std::string describe(const LedgerEntry& e) const {
    return "'" + comm(e.comm).name + "' #" + std::to_string(e.seq) + " (" + coll_op_name(e.op) + what(e) + ", " +
           std::to_string(e.bytes) + " B)";
  }
  std::string what(const LedgerEntry& e) const {
    auto it = whats.find(e.index);
    return it == whats.end() ? "" : ": " + it->second;
  }
  std::map<std::uint64_t, std::string> whats;  // ledger index -> purpose of a raw call
  // Identity of a communicator across ranks: its name and its world ranks.
  std::string key(const LedgerEntry& e) const {
    const CommInfo& c = comm(e.comm);
    return c.name + group_text(c.world_ranks);
  }
  std::string signature(const LedgerEntry& e) const { return spmd_signature(comm(e.comm).name, e, what(e)); }
};

std::string serialize(const Watch& w, std::int64_t waiting, double waited_s) {
  std::ostringstream os;
  os << "R " << w.rank << ' ' << waiting << ' ' << waited_s << ' ' << w.peer_group << '\n';
  const auto entries = ledger_entries();
  std::set<int> used;
  for (const auto& e : entries) used.insert(e.comm);
  // Groups in ranks of the watchdog's communicator (the world, unless a
  // caller watches a sub-communicator); -1 for ranks outside it.
  MPI_Group world = MPI_GROUP_NULL, diag = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Comm_group(w.diag, &diag);
  for (int id : used) {
    CommInfo c;
    {
      std::lock_guard<std::mutex> lock(ledger().mutex);  // the main thread may register one meanwhile
      c = registry()[id];
    }
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
  for (const auto& e : entries) {
    os << "E " << e.index << ' ' << e.seq << ' ' << e.comm << ' ' << static_cast<int>(e.op) << ' ' << e.blocking << ' '
       << e.complete << ' ' << e.bytes << '\n';
    if (e.what != nullptr) os << "W " << e.index << ' ' << e.what << '\n';  // the rest of the line
  }
  return os.str();
}

Report parse(const std::string& text) {
  Report r;
  std::istringstream in(text);
  std::string kind;
  while (in >> kind) {
    if (kind == "R") {
      in >> r.rank >> r.waiting >> r.waited_s >> r.peer_group;
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
    } else if (kind == "W") {
      std::uint64_t index = 0;
      std::string what;
      in >> index >> std::ws;
      std::getline(in, what);
      r.whats[index] = what;
    }
  }
  return r;
}

// --- The verdict --------------------------------------------------------------

// The first position (in each rank's own order of collectives) at which the
// answering ranks disagree; ranks issuing the same program agree everywhere.
// `among`: empty, or the peers compared when the job has several groups.
std::vector<std::string> first_divergence(const std::map<int, Report>& reports, const std::string& among) {
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
    const std::string at = "collective #" + std::to_string(g) + " of each rank" + among;
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
  return {"the ledgers agree" + among + ": every answering rank issued the same collectives (up to #" +
          std::to_string(hi) +
          "); a peer that is slow rather than divergent, or a stuck transport, or comm.timeout_s too short"};
}

// Who waits in what, and which members of that group have not issued it.
std::vector<std::string> waits(const std::map<int, Report>& reports) {
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
  std::vector<int> computing;
  for (const auto& [rank, r] : reports)
    if (r.waiting < 0) computing.push_back(rank);
  if (!computing.empty()) lines.push_back(ranks_text(computing) + ": in no collective (computing)");
  return lines;
}

// Ranks that did not answer the diagnosis.
std::vector<int> silent_ranks(const std::map<int, Report>& reports, int world) {
  std::vector<int> silent;
  for (int q = 0; q < world; ++q)
    if (!reports.count(q)) silent.push_back(q);
  return silent;
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

// The verdict, from the reports the coordinator collected.
std::vector<std::string> verdict(const Watch& w, const std::map<int, Report>& reports) {
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
  const std::vector<int> silent = silent_ranks(reports, w.size);
  if (!silent.empty()) {
    // Every live rank answers (its monitor thread does, whatever it computes
    // or waits in): the silent ones hold the others, whose ledgers then
    // differ only by how far each got before waiting for them.
    lines.push_back("stalled: " + ranks_text(silent) +
                    " did not answer the diagnosis (stopped, dead, or blocked outside MPI); the ranks below wait "
                    "for " +
                    (silent.size() == 1 ? "it" : "them"));
  } else {
    // Ledgers compare only between ranks that issue the same collectives
    // (one pipeline stage): stages differ by design.
    std::map<int, std::map<int, Report>> groups;
    for (const auto& [rank, r] : reports) groups[r.peer_group][rank] = r;
    for (const auto& [group, members] : groups) {
      if (members.size() < 2) continue;  // a stage of one rank: its waits below tell the story
      std::vector<int> ranks;
      for (const auto& [rank, r] : members) ranks.push_back(rank);
      const std::string among = groups.size() > 1 ? " among its peers (" + ranks_text(ranks) + ")" : "";
      for (auto& l : first_divergence(members, among)) lines.push_back(std::move(l));
    }
  }
  for (auto& l : waits(reports)) lines.push_back(std::move(l));
  lines.push_back(
      "the ranks must issue the same collectives in the same order on every communicator; the job ends (exit " +
      std::to_string(kCollectiveTimeoutExit) + ") instead of hanging");
  return lines;
}

// The diagnosis (ledger.hpp), on the monitor thread or in a polling wait.
// `raised`: this rank's own deadline passed; otherwise `alarm_from` raised
// the alarm. The caller has claimed g_diagnosing.
[[noreturn]] void diagnose(Watch& w, std::uint64_t waiting, double waited_s, bool raised, int alarm_from) {
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
  const std::string mine = serialize(w, waiting == kNoEntry ? -1 : static_cast<std::int64_t>(waiting), waited_s);
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
  const double grace = grace_s(w);
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
    std::this_thread::sleep_for(std::chrono::microseconds(100));
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
  std::string out;
  for (const auto& l : verdict(w, reports)) out += "ndmini: " + l + "\n";
  std::fputs(out.c_str(), stderr);
  end_job();
}

// Claims the diagnosis for this thread; false when it is under way already
// (the other thread of this rank runs it, or it ended the job).
bool claim_diagnosis() {
  bool expected = false;
  return g_diagnosing.compare_exchange_strong(expected, true);
}

// Answers another rank's alarm, if one came: does not return then.
void answer_alarm(Watch& w) {
  int flag = 0;
  MPI_Status st;
  MPI_Iprobe(MPI_ANY_SOURCE, kAlarmTag, w.diag, &flag, &st);
  if (!flag || !claim_diagnosis()) return;
  int from = 0;
  MPI_Recv(&from, 1, MPI_INT, st.MPI_SOURCE, kAlarmTag, w.diag, MPI_STATUS_IGNORE);
  const auto [waiting, waited_s] = wait_now();
  diagnose(w, waiting, waited_s, false, from);
}

// The monitor thread: the deadline of the main thread's wait, and alarms.
void monitor(Watch* w) {
  std::unique_lock<std::mutex> lock(w->mutex);
  while (!w->stop) {
    w->wake.wait_for(lock, kMonitorTick);
    if (w->stop || g_watch.load() != w || g_diagnosing) continue;  // an inner watchdog governs
    lock.unlock();
    const auto [waiting, waited_s] = wait_now();
    if (waiting != kNoEntry && waited_s > w->timeout_s && claim_diagnosis()) diagnose(*w, waiting, waited_s, true, -1);
    answer_alarm(*w);
    lock.lock();
  }
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
    case CollOp::barrier:
      return "barrier";
    case CollOp::setup:
      return "setup";
    case CollOp::all_to_all_v:
      return "all_to_all_v";
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
  std::lock_guard<std::mutex> lock(ledger().mutex);  // the monitor thread reads the registry too
  registry().push_back(std::move(info));
  return static_cast<int>(registry().size()) - 1;
}

const std::string& comm_name(int id) {
  std::lock_guard<std::mutex> lock(ledger().mutex);
  return registry().at(static_cast<std::size_t>(id)).name;
}

std::uint64_t ledger_record(int comm, std::uint64_t seq, CollOp op, std::int64_t bytes, bool blocking,
                            const char* what) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mutex);
  const std::uint64_t index = l.next++;
  l.ring[index % kLedgerSize] = LedgerEntry{index, seq, comm, op, blocking, false, bytes, what};
  return index;
}

void ledger_complete(std::uint64_t index) {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mutex);
  LedgerEntry& e = l.ring[index % kLedgerSize];
  if (e.index == index) e.complete = true;
}

std::vector<LedgerEntry> ledger_entries() {
  Ledger& l = ledger();
  std::lock_guard<std::mutex> lock(l.mutex);
  std::vector<LedgerEntry> out;
  const std::uint64_t first = l.next > kLedgerSize ? l.next - kLedgerSize : 0;
  for (std::uint64_t i = first; i < l.next; ++i) out.push_back(l.ring[i % kLedgerSize]);
  return out;
}

bool watch_alive() { return g_watch.load() != nullptr; }

bool waits_share_cores() {
  const Watch* w = g_watch.load();
  return w != nullptr && w->share_cores;
}

double watch_timeout_s() {
  const Watch* w = g_watch.load();
  return w != nullptr && !g_diagnosing ? w->timeout_s : 0.0;
}

// --- WaitScope --------------------------------------------------------------

WaitScope::WaitScope(std::uint64_t waiting) {
  CurrentWait& c = current_wait();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    outer_ = c.index != kNoEntry;
    if (!outer_) {
      c.index = waiting;
      c.start = Clock::now();
    }
  }
  const Watch* w = g_watch.load();
  polls_ = w != nullptr && w->timeout_s > 0 && !w->monitor.joinable();
}

WaitScope::~WaitScope() {
  if (outer_) return;
  CurrentWait& c = current_wait();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.index = kNoEntry;
}

bool WaitScope::expired() const {
  const Watch* w = g_watch.load();
  // Seconds compared as doubles: a deadline of any size cannot overflow.
  return w != nullptr && !g_diagnosing && wait_now().second > w->timeout_s;
}

void WaitScope::expire() const {
  const auto [waiting, waited_s] = wait_now();
  if (claim_diagnosis()) diagnose(*g_watch.load(), waiting, waited_s, true, -1);
  end_job();  // not reached: only this thread diagnoses without a monitor
}

void WaitScope::answer_alarm() const {
  // Polled about once a millisecond: a probe per spin would slow the wait.
  thread_local Clock::time_point next_poll{};
  const auto now = Clock::now();
  if (now < next_poll) return;
  next_poll = now + kAlarmPoll;
  if (Watch* w = g_watch.load(); w != nullptr && !g_diagnosing) detail::answer_alarm(*w);
}

}  // namespace detail

namespace {
// Collective over `world` (the first time: node_of_ranks): the ranks on this node (MPI_COMM_TYPE_SHARED)
// times this rank's Kokkos host threads, against the node's online CPUs
// (not this process's affinity mask: a launcher that binds each rank to a
// core of its own does not oversubscribe).
bool node_runs_more_threads_than_cores(MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const std::vector<int>& node = node_of_ranks(world);
  const auto local_ranks = std::count(node.begin(), node.end(), node[static_cast<std::size_t>(rank)]);
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const long threads = static_cast<long>(local_ranks) * std::max(1, Kokkos::DefaultHostExecutionSpace().concurrency());
  return cpus > 0 && threads > cpus;
}
}  // namespace

// --- CollectiveWatchdog ---------------------------------------------------------

CollectiveWatchdog::CollectiveWatchdog(MPI_Comm world, double timeout_s) : timeout_s_(timeout_s) {
  require(std::isfinite(timeout_s) && timeout_s >= 0,
          "comm.timeout_s must be a finite number of seconds >= 0 (0 disables hang detection)");
  auto w = std::make_unique<detail::Watch>();
  MPI_Comm_dup(world, &w->diag);
  MPI_Comm_rank(w->diag, &w->rank);
  MPI_Comm_size(w->diag, &w->size);
  w->timeout_s = timeout_s;
  w->share_cores = node_runs_more_threads_than_cores(world);
  w->outer = detail::g_watch.load();
  detail::Watch* raw = w.release();
  detail::g_watch = raw;
  // The monitor thread calls MPI beside the main thread: only with
  // MPI_THREAD_MULTIPLE; otherwise the waits poll (ledger.hpp).
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (timeout_s > 0 && provided == MPI_THREAD_MULTIPLE) raw->monitor = std::thread(detail::monitor, raw);
}

CollectiveWatchdog::~CollectiveWatchdog() {
  detail::Watch* w = detail::g_watch.load();
  if (w == nullptr) return;
  if (w->monitor.joinable()) {
    {
      std::lock_guard<std::mutex> lock(w->mutex);
      w->stop = true;
    }
    w->wake.notify_all();
    w->monitor.join();  // never returns while the monitor diagnoses: that ends the job
  }
  detail::g_watch = w->outer;
  MPI_Comm_free(&w->diag);
  delete w;
}

void CollectiveWatchdog::set_peer_group(int group) { detail::g_watch.load()->peer_group = group; }

}  // namespace ndmini
