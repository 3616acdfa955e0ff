#include "sim/baselines.h"

#include <algorithm>
#include <cmath>

namespace laissez::sim {
namespace {

constexpr Micros kSpotNotice = 120 * kMicrosPerSecond;  // AWS Spot (overheads.csv, spot row).

class BaselineSim final : public OnlineSim {
 public:
  BaselineSim(const World& w, const RunOptions& o, BaselinePolicy p) : OnlineSim(w, o), policy_(p) {}

 private:
  struct Entry {
    uint32_t job;
    uint32_t count;  // Nodes still wanted.
  };

  Status Start() override {
    free_.assign(world_.types.size(), {});
    for (uint32_t n = 0; n < world_.nodes.size(); ++n) free_[static_cast<size_t>(world_.nodes[n].type)].insert(n);
    incoming_.assign(world_.jobs.size(), 0);
    under_notice_.assign(world_.jobs.size(), 0);
    spot_bid_.assign(world_.jobs.size(), 0);
    wanted_.assign(world_.jobs.size(), 0);
    node_notice_.assign(world_.nodes.size(), 0);
    return Status::Ok();
  }

  Price HeldPrice(uint32_t, int type) override {
    const HwType& t = world_.types[static_cast<size_t>(type)];
    return policy_ == BaselinePolicy::kSpot ? t.spot_price : t.list_price;
  }

  // Ranked candidate types for a job.
  std::vector<int> Rank(uint32_t job) const {
    const Job& j = world_.jobs[job];
    std::vector<std::pair<double, int>> r;
    for (size_t t = 0; t < world_.types.size(); ++t) {
      if (j.speed[t] <= 0) continue;
      double key;
      if (policy_ == BaselinePolicy::kOnDemand) {
        key = static_cast<double>(j.value) * j.speed[t] - static_cast<double>(world_.types[t].list_price);
      } else if (policy_ == BaselinePolicy::kSpot) {
        key = static_cast<double>(j.value) * j.speed[t] - static_cast<double>(world_.types[t].spot_price);
      } else {
        key = j.speed[t];
      }
      r.emplace_back(key, static_cast<int>(t));
    }
    std::stable_sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<int> out;
    for (auto& [k, t] : r) out.push_back(t);
    return out;
  }

  // Preemption order: the job's value per node-hour (for spot, its launch-time
  // maximum price is its value). One number per job, not per type, so chains
  // of reclaims always end (no cycles of jobs displacing each other).
  double Priority(uint32_t job, int /*type*/) const { return static_cast<double>(world_.jobs[job].value); }

  void Take(uint32_t job, int type, uint32_t count) {
    auto& pool = free_[static_cast<size_t>(type)];
    for (uint32_t i = 0; i < count && !pool.empty(); ++i) {
      uint32_t n = *pool.begin();
      pool.erase(pool.begin());
      if (policy_ == BaselinePolicy::kSpot) spot_bid_[job] = static_cast<Price>(Priority(job, type));
      GrantNode(job, n);
    }
  }

  void Free(uint32_t job, uint32_t node, bool clean, bool evicted) {
    RevokeNode(job, node, clean, evicted);
    free_[static_cast<size_t>(world_.nodes[node].type)].insert(node);
  }

  void ReleaseAll(uint32_t job, bool clean, bool evicted) {
    std::vector<uint32_t> nodes = runs_[job].nodes;
    for (uint32_t n : nodes) Free(job, n, clean, evicted);
  }

  // Running jobs (or inference nodes) on `type` below `prio`, lowest first.
  std::vector<std::pair<uint32_t, uint32_t>> Victims(int type, double prio, uint32_t self) {
    std::vector<std::tuple<double, uint32_t, uint32_t>> v;  // (prio, job, node)
    for (uint32_t n = 0; n < world_.nodes.size(); ++n) {
      int32_t h = holder(n);
      if (h < 0 || world_.nodes[n].type != type || static_cast<uint32_t>(h) == self) continue;
      if (under_notice_[static_cast<size_t>(h)] || node_notice_[n]) continue;
      double p = policy_ == BaselinePolicy::kSpot ? static_cast<double>(spot_bid_[static_cast<size_t>(h)])
                                                  : Priority(static_cast<uint32_t>(h), type);
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
    const Job& j = world_.jobs[e.job];
    const bool batch = j.kind != JobKind::kInference;
    std::vector<int> ranked = Rank(e.job);
    if (ranked.empty()) return false;
    if (batch) {
      // A gang of one type, all at once.
      if (policy_ == BaselinePolicy::kFcfsP) {
        int pref = ranked[0];
        if (TryPreempt(e, pref)) return true;
      }
      if (policy_ == BaselinePolicy::kSpot) {
        if (incoming_[e.job] > 0) return false;  // Waiting for reclaimed nodes.
        for (int t : ranked) {
          if (free_[static_cast<size_t>(t)].size() >= e.count) {
            Take(e.job, t, e.count);
            return true;
          }
        }
        for (int t : ranked) {
          if (TryReclaim(e, t)) return false;
          if (free_[static_cast<size_t>(t)].size() >= e.count) {  // Freed at once.
            Take(e.job, t, e.count);
            return true;
          }
        }
        return false;
      }
      for (int t : ranked) {
        if (free_[static_cast<size_t>(t)].size() >= e.count) {
          Take(e.job, t, e.count);
          return true;
        }
      }
      return false;
    }
    // Inference: single nodes of any type, best first.
    for (int t : ranked) {
      uint32_t take = std::min<uint32_t>(e.count, static_cast<uint32_t>(free_[static_cast<size_t>(t)].size()));
      Take(e.job, t, take);
      e.count -= take;
      if (e.count == 0) return true;
    }
    if (policy_ == BaselinePolicy::kFcfsP && TryPreempt(e, ranked[0])) return e.count == 0;
    // Spot inference fleets take free capacity only (they do not reclaim).
    return false;
  }

  bool TryPreempt(Entry& e, int type) {
    auto& pool = free_[static_cast<size_t>(type)];
    if (pool.size() >= e.count) {
      Take(e.job, type, e.count);
      e.count = 0;
      return true;
    }
    auto victims = Victims(type, Priority(e.job, type), e.job);
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
        // One node of an inference fleet.
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

  // Spot: notices to lower bidders so that `e` can launch on `type` later.
  bool TryReclaim(Entry& e, int type) {
    auto& pool = free_[static_cast<size_t>(type)];
    auto victims = Victims(type, Priority(e.job, type), e.job);
    size_t avail = pool.size() + incoming_[e.job];
    std::vector<std::pair<uint32_t, uint32_t>> chosen;
    for (auto& [vj, n] : victims) {
      if (avail >= e.count) break;
      if (std::any_of(chosen.begin(), chosen.end(), [&](auto& c) { return c.first == vj && IsBatch(vj); })) continue;
      chosen.emplace_back(vj, n);
      avail += IsBatch(vj) ? runs_[vj].nodes.size() : 1;
    }
    if (avail < e.count) return false;
    bool freed_now = false;
    for (auto& [vj, n] : chosen) {
      const uint32_t freed = IsBatch(vj) ? static_cast<uint32_t>(runs_[vj].nodes.size()) : 1;
      incoming_[e.job] += freed;
      if (IsBatch(vj)) {
        under_notice_[vj] = 1;
        Notice(vj, n, now() + kSpotNotice);
      }
      // tag: node + 1 for one inference node, 0 for the whole batch job; the beneficiary in the high bits.
      uint64_t tag = (static_cast<uint64_t>(e.job) << 32) | (IsBatch(vj) ? 0 : static_cast<uint64_t>(n) + 1);
      if (!IsBatch(vj)) node_notice_[n] = 1;  // Not chosen again while its notice runs.
      SetTimer(now() + kSpotNotice, vj, tag);
    }
    // Nodes freed at once: the caller's next pass can launch on them.
    return !freed_now;
  }

  void OnTimer(uint32_t job, uint64_t tag) override {
    uint32_t beneficiary = static_cast<uint32_t>(tag >> 32);
    uint32_t node_plus = static_cast<uint32_t>(tag & 0xffffffffu);
    if (node_plus == 0) {
      if (under_notice_[job]) {
        incoming_[beneficiary] = 0;
        under_notice_[job] = 0;
        if (!runs_[job].nodes.empty()) {
          ReleaseAll(job, /*clean=*/false, /*evicted=*/true);
          Requeue(job);
        }
      }
    } else {
      uint32_t n = node_plus - 1;
      node_notice_[n] = 0;
      incoming_[beneficiary] = 0;
      if (holder(n) == static_cast<int32_t>(job)) Free(job, n, false, true);
    }
    Schedule();
  }

  // Victims wait here until Schedule() merges them back (queue entries must
  // not move while an entry is being served).
  void Requeue(uint32_t job) {
    if (world_.jobs[job].kind == JobKind::kInference) return;
    requeue_.push_back(job);
  }

  void MergeRequeue() {
    for (uint32_t job : requeue_) {
      if (std::any_of(queue_.begin(), queue_.end(), [&](const Entry& x) { return x.job == job; })) continue;
      // FCFS order: by arrival (job ids are in arrival order).
      auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Entry& x) { return x.job > job; });
      queue_.insert(it, Entry{job, world_.jobs[job].nodes});
    }
    requeue_.clear();
  }

  void Schedule() {
    const bool strict = policy_ == BaselinePolicy::kFcfs || policy_ == BaselinePolicy::kFcfsP;
    bool progress = true;
    // Each pass serves one entry; the bound only guards against a policy bug.
    for (size_t passes = 0; progress && passes < 4 * queue_.size() + 64; ++passes) {
      progress = false;
      MergeRequeue();
      if (policy_ == BaselinePolicy::kSpot) {
        std::stable_sort(queue_.begin(), queue_.end(), [&](const Entry& a, const Entry& b) {
          return BestBid(a.job) > BestBid(b.job);
        });
      }
      for (size_t i = 0; i < queue_.size(); ++i) {
        Entry e = queue_[i];
        bool done = Serve(e);
        queue_[i].count = e.count;
        if (done) {
          queue_.erase(queue_.begin() + static_cast<ptrdiff_t>(i));
          progress = true;
          break;
        }
        if (strict) break;
      }
    }
    MergeRequeue();
  }

  double BestBid(uint32_t job) const {
    double b = 0;
    for (size_t t = 0; t < world_.types.size(); ++t) b = std::max(b, Priority(job, static_cast<int>(t)));
    return b;
  }

  void OnArrival(uint32_t job) override {
    if (IsBatch(job)) {
      queue_.push_back(Entry{job, world_.jobs[job].nodes});
      Schedule();
    }
  }

  void OnFinished(uint32_t job) override {
    ReleaseAll(job, /*clean=*/true, /*evicted=*/false);
    Schedule();
  }

  void OnYield(uint32_t job) override {
    // Spot: the job checkpointed inside its notice; give the nodes back now.
    if (policy_ != BaselinePolicy::kSpot || !under_notice_[job]) return;
    ReleaseAll(job, /*clean=*/true, /*evicted=*/true);
    under_notice_[job] = 0;
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
  std::vector<uint32_t> incoming_;
  std::vector<uint8_t> under_notice_;
  std::vector<Price> spot_bid_;
  std::vector<uint32_t> wanted_;
  std::vector<uint32_t> requeue_;
  std::vector<uint8_t> node_notice_;
};

}  // namespace

std::string BaselineMechanism::name() const {
  switch (policy_) {
    case BaselinePolicy::kOnDemand: return "ondemand";
    case BaselinePolicy::kFcfs: return "fcfs";
    case BaselinePolicy::kFcfsP: return "fcfsp";
    case BaselinePolicy::kSpot: return "spot";
  }
  return "?";
}

Result<RunResult> BaselineMechanism::Run(const World& world, const RunOptions& options) {
  BaselineSim sim(world, options, policy_);
  return sim.Execute(name());
}

}  // namespace laissez::sim
