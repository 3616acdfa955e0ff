#include "sim/baselines.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace laissez::sim {
namespace {

constexpr Micros kSpotNotice = 120 * kMicrosPerSecond;  // AWS Spot (overheads.csv, spot row).
constexpr Micros kRetryEvery = 5 * 60 * kMicrosPerSecond;
// Timer tags: a batch victim's notice (its sequence number), one serving
// node's notice (kNodeTag | sequence << 32 | node + 1), or a retry.
constexpr uint64_t kRetryTag = uint64_t{1} << 63;
constexpr uint64_t kNodeTag = uint64_t{1} << 62;
constexpr double kNeverVictim = std::numeric_limits<double>::infinity();

class BaselineSim final : public OnlineSim {
 public:
  BaselineSim(const World& w, const RunOptions& o, BaselinePolicy p) : OnlineSim(w, o), policy_(p) {}

 private:
  struct Entry {
    uint32_t job;
    uint32_t count;  // Nodes still wanted.
  };

  bool IsSpot() const { return policy_ == BaselinePolicy::kSpot || policy_ == BaselinePolicy::kSpotCapacity; }
  bool Reclaims() const { return IsSpot() || policy_ == BaselinePolicy::kSrpt; }
  bool Strict() const { return policy_ == BaselinePolicy::kFcfs || policy_ == BaselinePolicy::kFcfsP; }

  Status Start() override {
    free_.assign(world_.types.size(), {});
    for (uint32_t n = 0; n < world_.nodes.size(); ++n) free_[static_cast<size_t>(world_.nodes[n].type)].insert(n);
    const size_t J = world_.jobs.size();
    reserved_.assign(J, {});
    incoming_.assign(J, 0);
    claimant_.assign(J, -1);
    promised_.assign(J, 0);
    notice_seq_.assign(J, 0);
    next_try_.assign(J, 0);
    node_claimant_.assign(world_.nodes.size(), -1);
    node_seq_.assign(world_.nodes.size(), 0);
    launch_bid_.resize(J);
    for (uint32_t j = 0; j < J; ++j) launch_bid_[j] = LaunchBid(world_, j);
    return Status::Ok();
  }

  Price HeldPrice(uint32_t, int type) override {
    const HwType& t = world_.types[static_cast<size_t>(type)];
    return IsSpot() ? t.spot_price : t.list_price;
  }

  // Candidate types for a job, best first (see baselines.h: type choice).
  std::vector<int> Rank(uint32_t job) const {
    const Job& j = world_.jobs[job];
    const bool by_surplus = world_.utility == Utility::kValue && !Strict() && policy_ != BaselinePolicy::kSrpt;
    std::vector<std::pair<double, int>> r;
    for (size_t t = 0; t < world_.types.size(); ++t) {
      if (j.speed[t] <= 0) continue;
      double key = j.speed[t];
      if (by_surplus) {
        const HwType& h = world_.types[t];
        key = static_cast<double>(j.value) * j.speed[t] - static_cast<double>(IsSpot() ? h.spot_price : h.list_price);
      }
      r.emplace_back(key, static_cast<int>(t));
    }
    std::stable_sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<int> out;
    for (auto& [k, t] : r) out.push_back(t);
    return out;
  }

  // Estimated work left in hours (the tenant's estimate; at least a minute).
  double EstRemaining(uint32_t job) const {
    return std::max(world_.jobs[job].estimated_hours - WorkDone(job), 1.0 / 60);
  }
  // The same in node-hours: what SRPT ranks by, so that a short gang does not
  // stop four nodes to run on one.
  double EstRemainingWork(uint32_t job) const { return EstRemaining(job) * world_.jobs[job].nodes; }
  double MoveOverheadHours(uint32_t job) const {
    const Job& j = world_.jobs[job];
    return static_cast<double>(j.restore + j.ckpt_save) / kMicrosPerHour;
  }

  // A running job's rank as a victim: lower goes first.
  double Priority(uint32_t job) const {
    switch (policy_) {
      case BaselinePolicy::kSpotCapacity:
        return IsBatch(job) ? -static_cast<double>(job) : kNeverVictim;  // The most recent arrival first.
      case BaselinePolicy::kSrpt:
        return IsBatch(job) ? -EstRemainingWork(job) : kNeverVictim;  // The most remaining work first.
      default:
        return launch_bid_[job];
    }
  }
  // A waiting job's rank as a claimant: it may take nodes from victims below it.
  double ClaimPriority(uint32_t job) const {
    switch (policy_) {
      case BaselinePolicy::kSpotCapacity: return -static_cast<double>(job);
      case BaselinePolicy::kSrpt: return -(EstRemaining(job) + MoveOverheadHours(job)) * world_.jobs[job].nodes;
      default: return launch_bid_[job];
    }
  }

  bool InQueue(uint32_t job) const {
    return std::any_of(queue_.begin(), queue_.end(), [&](const Entry& x) { return x.job == job; }) ||
           std::find(requeue_.begin(), requeue_.end(), job) != requeue_.end();
  }

  void Take(uint32_t job, int type, uint32_t count) {
    auto& pool = free_[static_cast<size_t>(type)];
    for (uint32_t i = 0; i < count && !pool.empty(); ++i) {
      uint32_t n = *pool.begin();
      pool.erase(pool.begin());
      GrantNode(job, n);
    }
  }

  // A freed node goes to the job it was reclaimed for (`claimant` >= 0, still
  // waiting), else back to the pool.
  void Give(uint32_t node, int32_t claimant) {
    if (claimant >= 0 && InQueue(static_cast<uint32_t>(claimant))) {
      reserved_[static_cast<size_t>(claimant)].push_back(node);
    } else {
      free_[static_cast<size_t>(world_.nodes[node].type)].insert(node);
    }
  }

  void ReleaseReservation(uint32_t job) {
    for (uint32_t n : reserved_[job]) free_[static_cast<size_t>(world_.nodes[n].type)].insert(n);
    reserved_[job].clear();
  }

  // Grants `count` nodes of `type`: the reserved ones first, then free ones.
  void TakeReserved(uint32_t job, int type, uint32_t count) {
    std::vector<uint32_t> mine;
    mine.swap(reserved_[job]);
    uint32_t granted = 0;
    for (uint32_t n : mine) {
      if (granted < count && world_.nodes[n].type == type) {
        GrantNode(job, n);
        ++granted;
      } else {
        free_[static_cast<size_t>(world_.nodes[n].type)].insert(n);
      }
    }
    Take(job, type, count - granted);
  }

  // One node leaves `job`; a serving node under notice goes to its claimant.
  void Free(uint32_t job, uint32_t node, bool clean, bool evicted) {
    RevokeNode(job, node, clean, evicted);
    int32_t c = node_claimant_[node];
    if (c >= 0) {
      node_claimant_[node] = -1;
      ++node_seq_[node];
      if (incoming_[static_cast<size_t>(c)] > 0) --incoming_[static_cast<size_t>(c)];
    }
    Give(node, c);
  }

  void ReleaseAll(uint32_t job, bool clean, bool evicted) {
    std::vector<uint32_t> nodes = runs_[job].nodes;
    for (uint32_t n : nodes) Free(job, n, clean, evicted);
  }

  // A batch victim gives its nodes up; they go to its claimant.
  void ReleaseVictim(uint32_t job, bool clean, bool evicted) {
    int32_t c = claimant_[job];
    claimant_[job] = -1;
    if (c >= 0) {
      uint32_t& in = incoming_[static_cast<size_t>(c)];
      in -= std::min(in, promised_[job]);
    }
    promised_[job] = 0;
    std::vector<uint32_t> nodes = runs_[job].nodes;
    for (uint32_t n : nodes) {
      RevokeNode(job, n, clean, evicted);
      Give(n, c);
    }
  }

  // Held nodes of `type` whose holders rank below `prio`, lowest first, as
  // (job, node); jobs and nodes already under notice are not chosen again.
  std::vector<std::pair<uint32_t, uint32_t>> Victims(int type, double prio, uint32_t self) {
    std::vector<std::tuple<double, uint32_t, uint32_t>> v;  // (priority, job, node)
    for (uint32_t n = 0; n < world_.nodes.size(); ++n) {
      int32_t h = holder(n);
      if (h < 0 || world_.nodes[n].type != type || static_cast<uint32_t>(h) == self) continue;
      if (claimant_[static_cast<size_t>(h)] >= 0 || node_claimant_[n] >= 0) continue;
      double p = Priority(static_cast<uint32_t>(h));
      if (p < prio) v.emplace_back(p, static_cast<uint32_t>(h), n);
    }
    std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) {
      return std::get<0>(a) != std::get<0>(b) ? std::get<0>(a) < std::get<0>(b) : std::get<1>(a) < std::get<1>(b);
    });
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (auto& [p, j, n] : v) out.emplace_back(j, n);
    return out;
  }

  // Tries to serve one queue entry; returns true when it needs nothing more.
  bool Serve(Entry& e) {
    std::vector<int> ranked = Rank(e.job);
    if (ranked.empty()) return false;
    if (IsBatch(e.job)) {
      // A gang of one type, all at once; nodes reclaimed for it first.
      auto& mine = reserved_[e.job];
      if (!mine.empty()) {
        int t = world_.nodes[mine.front()].type;
        if (mine.size() + free_[static_cast<size_t>(t)].size() >= e.count) {
          TakeReserved(e.job, t, e.count);
          return true;
        }
      }
      if (incoming_[e.job] > 0) return false;  // Waiting for reclaimed nodes.
      if (policy_ == BaselinePolicy::kFcfsP && TryPreempt(e, ranked[0])) return true;
      for (int t : ranked) {
        if (free_[static_cast<size_t>(t)].size() >= e.count) {
          ReleaseReservation(e.job);
          Take(e.job, t, e.count);
          return true;
        }
      }
      if (Reclaims()) {
        for (int t : ranked) {
          if (!TryReclaim(e, t)) continue;
          // SRPT's victims with nothing to save leave at once: start now if
          // that was enough, rather than at the next event.
          if (incoming_[e.job] == 0 && mine.size() + free_[static_cast<size_t>(t)].size() >= e.count) {
            TakeReserved(e.job, t, e.count);
            return true;
          }
          return false;
        }
      }
      return false;
    }
    // Serving: single nodes of any type, best first.
    for (int t : ranked) {
      uint32_t take = std::min<uint32_t>(e.count, static_cast<uint32_t>(free_[static_cast<size_t>(t)].size()));
      Take(e.job, t, take);
      e.count -= take;
      if (e.count == 0) return true;
    }
    if (policy_ == BaselinePolicy::kFcfsP && TryPreempt(e, ranked[0])) return e.count == 0;
    // Fleets under spot and SRPT take free capacity only (they do not reclaim).
    return false;
  }

  // FCFS-P: preempts lower-bid holders of `type` at once, without notice.
  bool TryPreempt(Entry& e, int type) {
    auto& pool = free_[static_cast<size_t>(type)];
    if (pool.size() >= e.count) {
      Take(e.job, type, e.count);
      e.count = 0;
      return true;
    }
    auto victims = Victims(type, ClaimPriority(e.job), e.job);
    size_t avail = pool.size();
    std::vector<uint32_t> jobs;
    for (auto& [vj, n] : victims) {
      if (avail >= e.count) break;
      if (std::find(jobs.begin(), jobs.end(), vj) != jobs.end()) continue;
      jobs.push_back(vj);
      avail += IsBatch(vj) ? runs_[vj].nodes.size() : 1;
    }
    if (avail < e.count) return false;
    for (uint32_t vj : jobs) {
      if (IsBatch(vj)) {
        ReleaseAll(vj, /*clean=*/false, /*evicted=*/true);
        Requeue(vj);
      } else {
        // One node of a serving fleet.
        for (auto& [x, n] : victims) {
          if (x == vj && holder(n) == static_cast<int32_t>(vj)) {
            Free(vj, n, false, true);
            break;
          }
        }
      }
    }
    Take(e.job, type, e.count);
    e.count = 0;
    return true;
  }

  // Notices to lower-ranked holders so that `e` can start on `type` when they
  // leave; their nodes are reserved for it. True if enough were noticed.
  bool TryReclaim(Entry& e, int type) {
    const uint32_t job = e.job;
    size_t avail = free_[static_cast<size_t>(type)].size() + incoming_[job];
    for (uint32_t n : reserved_[job]) avail += world_.nodes[n].type == type;
    auto victims = Victims(type, ClaimPriority(job), job);
    std::vector<std::pair<uint32_t, uint32_t>> chosen;
    for (auto& [vj, n] : victims) {
      if (avail >= e.count) break;
      if (IsBatch(vj) && std::any_of(chosen.begin(), chosen.end(), [&](auto& c) { return c.first == vj; })) continue;
      chosen.emplace_back(vj, n);
      avail += IsBatch(vj) ? runs_[vj].nodes.size() : 1;
    }
    if (avail < e.count) return false;
    // Reserved nodes of another type are of no use here.
    std::vector<uint32_t> keep;
    for (uint32_t n : reserved_[job]) {
      if (world_.nodes[n].type == type) keep.push_back(n);
      else free_[static_cast<size_t>(world_.nodes[n].type)].insert(n);
    }
    reserved_[job] = std::move(keep);
    for (auto& [vj, n] : chosen) {
      const Micros deadline = NoticeDeadline(vj);
      if (IsBatch(vj)) {
        const uint32_t freed = static_cast<uint32_t>(runs_[vj].nodes.size());
        claimant_[vj] = static_cast<int32_t>(job);
        promised_[vj] = freed;
        incoming_[job] += freed;
        if (policy_ == BaselinePolicy::kSrpt && !IsRunning(vj)) {
          // Nothing to save: it leaves at once.
          ReleaseVictim(vj, /*clean=*/true, /*evicted=*/true);
          Requeue(vj);
          continue;
        }
        Notice(vj, n, deadline);
        SetTimer(deadline, vj, ++notice_seq_[vj]);
      } else {
        node_claimant_[n] = static_cast<int32_t>(job);
        incoming_[job] += 1;
        SetTimer(deadline, vj, kNodeTag | (static_cast<uint64_t>(++node_seq_[n]) << 32) | (n + 1));
      }
    }
    return true;
  }

  // SRPT stops a victim at its next checkpoint; spot gives two minutes.
  Micros NoticeDeadline(uint32_t victim) const {
    const Job& j = world_.jobs[victim];
    if (policy_ == BaselinePolicy::kSrpt && j.ckpt_interval > 0) return now() + j.ckpt_interval + j.ckpt_save;
    return now() + kSpotNotice;
  }

  void OnTimer(uint32_t job, uint64_t tag) override {
    if (tag & kRetryTag) {
      Schedule();
      return;
    }
    if (tag & kNodeTag) {
      uint32_t n = static_cast<uint32_t>(tag & 0xffffffffu) - 1;
      uint32_t seq = static_cast<uint32_t>((tag & ~kNodeTag) >> 32);
      if (node_seq_[n] == seq && node_claimant_[n] >= 0 && holder(n) == static_cast<int32_t>(job))
        Free(job, n, false, true);
    } else if (tag == notice_seq_[job] && claimant_[job] >= 0) {
      // The notice ran out before a clean stop: the uncommitted work is lost.
      ReleaseVictim(job, /*clean=*/false, /*evicted=*/true);
      Requeue(job);
    }
    Schedule();
  }

  // Victims wait here until Schedule() merges them back (queue entries must
  // not move while an entry is being served).
  void Requeue(uint32_t job) {
    if (!IsBatch(job) || runs_[job].phase == Phase::kDone) return;
    if (std::find(requeue_.begin(), requeue_.end(), job) == requeue_.end()) requeue_.push_back(job);
  }

  void MergeRequeue() {
    for (uint32_t job : requeue_) {
      if (std::any_of(queue_.begin(), queue_.end(), [&](const Entry& x) { return x.job == job; })) continue;
      // By arrival (job ids are in arrival order); sorted policies re-sort.
      auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Entry& x) { return x.job > job; });
      queue_.insert(it, Entry{job, world_.jobs[job].nodes});
    }
    requeue_.clear();
  }

  void SortQueue() {
    auto by = [&](auto key) {
      std::stable_sort(queue_.begin(), queue_.end(), [&](const Entry& a, const Entry& b) { return key(a.job) < key(b.job); });
    };
    switch (policy_) {
      case BaselinePolicy::kSpot: by([&](uint32_t j) { return -launch_bid_[j]; }); break;
      case BaselinePolicy::kOnDemandSmallest:
        by([&](uint32_t j) { return IsBatch(j) ? world_.jobs[j].estimated_hours * world_.jobs[j].nodes : 0.0; });
        break;
      case BaselinePolicy::kSrpt: by([&](uint32_t j) { return IsBatch(j) ? EstRemainingWork(j) : 0.0; }); break;
      default: break;
    }
  }

  void Schedule() {
    const bool retry = policy_ == BaselinePolicy::kOnDemandRetry;
    bool progress = true;
    // Each pass serves one entry; the bound only guards against a policy bug.
    for (size_t passes = 0; progress && passes < 4 * queue_.size() + 64; ++passes) {
      progress = false;
      MergeRequeue();
      SortQueue();
      for (size_t i = 0; i < queue_.size(); ++i) {
        Entry e = queue_[i];
        if (retry && IsBatch(e.job) && next_try_[e.job] > now()) continue;
        bool done = Serve(e);
        queue_[i].count = e.count;
        if (done) {
          queue_.erase(queue_.begin() + static_cast<ptrdiff_t>(i));
          progress = true;
          break;
        }
        if (retry && IsBatch(e.job)) {
          // A capacity error: the tenant tries again later.
          next_try_[e.job] = now() + kRetryEvery;
          SetTimer(next_try_[e.job], e.job, kRetryTag);
        }
        if (Strict()) break;
      }
    }
    MergeRequeue();
  }

  void OnArrival(uint32_t job) override {
    if (IsBatch(job)) {
      queue_.push_back(Entry{job, world_.jobs[job].nodes});
      Schedule();
    }
  }

  void OnFinished(uint32_t job) override {
    if (claimant_[job] >= 0) {
      ReleaseVictim(job, /*clean=*/true, /*evicted=*/false);
    } else {
      ReleaseAll(job, /*clean=*/true, /*evicted=*/false);
    }
    // A fleet leaving at the end of a drained run drops its queue entry.
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Entry& e) { return e.job == job; });
    if (it != queue_.end()) queue_.erase(it);
    ReleaseReservation(job);
    Schedule();
  }

  void OnYield(uint32_t job) override {
    // The job checkpointed inside its notice; its nodes go to the claimant now.
    if (claimant_[job] < 0) return;
    ReleaseVictim(job, /*clean=*/true, /*evicted=*/true);
    Requeue(job);
    Schedule();
  }

  void OnAutoscale(uint32_t job, double target) override {
    const Job& j = world_.jobs[job];
    double cap = 0;
    for (uint32_t n : runs_[job].nodes) cap += j.speed[static_cast<size_t>(world_.nodes[n].type)];
    double best = 0;
    for (double s : j.speed) best = std::max(best, s);
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Entry& e) { return e.job == job; });
    if (cap < target) {
      uint32_t want = static_cast<uint32_t>(std::ceil((target - cap) / best - 1e-9));
      if (it != queue_.end()) it->count = want;
      else queue_.push_back(Entry{job, want});
    } else {
      if (it != queue_.end()) queue_.erase(it);
      // Shed the slowest nodes while capacity stays above the target.
      while (!runs_[job].nodes.empty()) {
        uint32_t worst = runs_[job].nodes[0];
        for (uint32_t n : runs_[job].nodes)
          if (j.speed[static_cast<size_t>(world_.nodes[n].type)] < j.speed[static_cast<size_t>(world_.nodes[worst].type)])
            worst = n;
        double s = j.speed[static_cast<size_t>(world_.nodes[worst].type)];
        if (cap - s < target) break;
        cap -= s;
        Free(job, worst, true, false);
      }
    }
    Schedule();
  }

  BaselinePolicy policy_;
  std::vector<std::set<uint32_t>> free_;
  std::deque<Entry> queue_;
  std::vector<uint32_t> requeue_;
  std::vector<std::vector<uint32_t>> reserved_;  // Per claimant: reclaimed nodes held for it.
  std::vector<uint32_t> incoming_;               // Per claimant: nodes under notice for it.
  std::vector<int32_t> claimant_;                // Per batch victim under notice: who gets its nodes.
  std::vector<uint32_t> promised_;               // Per batch victim: nodes counted in its claimant's incoming_.
  std::vector<uint64_t> notice_seq_;             // Per batch victim: invalidates stale notice timers.
  std::vector<Micros> next_try_;                 // Retrying on-demand: a job's next launch attempt.
  std::vector<int32_t> node_claimant_;           // Per serving node under notice: who gets it.
  std::vector<uint32_t> node_seq_;
  std::vector<double> launch_bid_;
};

}  // namespace

double LaunchBid(const World& world, uint32_t job) {
  const Job& j = world.jobs[job];
  if (world.utility == Utility::kValue) return static_cast<double>(j.value);
  const double u = static_cast<double>(world.retention_value);
  if (j.kind != JobKind::kInference) return u / std::max(1e-6, j.estimated_hours * j.nodes);
  return u / std::max(1e-6, OfferedNodeHours(world, job));
}

std::string BaselineMechanism::name() const {
  switch (policy_) {
    case BaselinePolicy::kOnDemand: return "ondemand";
    case BaselinePolicy::kOnDemandSmallest: return "ondemand-sf";
    case BaselinePolicy::kOnDemandRetry: return "ondemand-retry";
    case BaselinePolicy::kFcfs: return "fcfs";
    case BaselinePolicy::kFcfsP: return "fcfsp";
    case BaselinePolicy::kSpot: return "spot";
    case BaselinePolicy::kSpotCapacity: return "spot-capacity";
    case BaselinePolicy::kSrpt: return "srpt";
  }
  return "?";
}

Result<RunResult> BaselineMechanism::Run(const World& world, const RunOptions& options) {
  BaselineSim sim(world, options, policy_);
  return sim.Execute(name());
}

}  // namespace laissez::sim
