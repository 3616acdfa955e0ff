#include "sim/online_sim.h"

#include <algorithm>
#include <cmath>

namespace laissez::sim {
namespace {
constexpr double kHour = static_cast<double>(kMicrosPerHour);
constexpr Micros kMinute = 60 * kMicrosPerSecond;
}  // namespace

OnlineSim::OnlineSim(const World& world, const RunOptions& options) : world_(world), options_(options) {}

void OnlineSim::Push(Micros t, Ev type, uint32_t job, uint64_t version) {
  queue_.push(Event{t, seq_++, type, job, version});
}

double OnlineSim::DoneAt(const JobRun& r, const Job& j, Micros t) const {
  if (r.phase == Phase::kSaving) return r.frozen;
  if (r.phase != Phase::kRunning) return r.committed;
  const double tau = static_cast<double>(t - r.run_start);
  double work;
  if (j.ckpt_interval > 0) {
    const double c = static_cast<double>(j.ckpt_interval), cyc = c + static_cast<double>(j.ckpt_save);
    const double m = std::floor(tau / cyc);
    work = m * c + std::min(tau - m * cyc, c);
  } else {
    work = tau;
  }
  return std::min(j.ideal_hours, r.base + r.eff * work / kHour);
}

double OnlineSim::CommittedAt(const JobRun& r, const Job& j, Micros t) const {
  if (r.phase == Phase::kSaving) return r.frozen_committed;
  if (r.phase != Phase::kRunning) return r.committed;
  if (j.ckpt_interval <= 0) return r.base;
  const double tau = static_cast<double>(t - r.run_start);
  const double c = static_cast<double>(j.ckpt_interval), cyc = c + static_cast<double>(j.ckpt_save);
  const double m = std::floor(tau / cyc);
  return std::min(j.ideal_hours, r.base + r.eff * m * c / kHour);
}

double OnlineSim::WorkDone(uint32_t job) const { return DoneAt(runs_[job], world_.jobs[job], now_); }
double OnlineSim::Uncommitted(uint32_t job) const {
  const JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  if (r.phase != Phase::kRunning || j.ckpt_interval <= 0) return DoneAt(r, j, now_) - CommittedAt(r, j, now_);
  // Running with checkpoints: DoneAt - CommittedAt with the cycle count
  // computed once (the tenants' limits read this every minute per node).
  const double tau = static_cast<double>(now_ - r.run_start);
  const double c = static_cast<double>(j.ckpt_interval), cyc = c + static_cast<double>(j.ckpt_save);
  const double m = std::floor(tau / cyc);
  const double done = std::min(j.ideal_hours, r.base + r.eff * (m * c + std::min(tau - m * cyc, c)) / kHour);
  return done - std::min(j.ideal_hours, r.base + r.eff * m * c / kHour);
}
double OnlineSim::Remaining(uint32_t job) const { return world_.jobs[job].ideal_hours - WorkDone(job); }

double OnlineSim::InferenceNeed(uint32_t job, Micros t) const {
  const auto& need = world_.jobs[job].need;
  if (need.empty()) return 0;
  size_t m = static_cast<size_t>(std::max<Micros>(0, t) / kMinute);
  return need[std::min(m, need.size() - 1)];
}

void OnlineSim::Record(uint32_t node, int32_t job, int32_t from) {
  if (options_.record_allocations) result_.log.push_back(AllocationRecord{now_, node, job, from});
}

void OnlineSim::AccrueInference(uint32_t job) {
  JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  // Fleets live until the horizon; a drained run goes on without them.
  const Micros until = std::min(now_, world_.horizon);
  while (r.acc_at < until) {
    Micros next = std::min(until, (r.acc_at / kMinute + 1) * kMinute);
    double cap = 0;
    for (size_t i = 0; i < r.nodes.size(); ++i) {
      if (r.ready_at[i] <= r.acc_at) {
        cap += j.speed[static_cast<size_t>(world_.nodes[r.nodes[i]].type)];
      } else {
        next = std::min(next, r.ready_at[i]);
      }
    }
    double need = InferenceNeed(job, r.acc_at);
    double dt = static_cast<double>(next - r.acc_at) / kHour;
    r.needed += need * dt;
    r.served += std::min(need, cap) * dt;
    r.acc_at = next;
  }
}

void OnlineSim::GrantNode(uint32_t job, uint32_t node) {
  if (holder_[node] >= 0) {
    // A mechanism bug; surfaced by the typed invariant suite through the log.
    Record(node, static_cast<int32_t>(job), holder_[node]);
    return;
  }
  JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  holder_[node] = static_cast<int32_t>(job);
  holder_since_[node] = now_;
  ++grants_;
  Record(node, static_cast<int32_t>(job), -1);
  if (j.kind == JobKind::kInference) AccrueInference(job);
  r.nodes.push_back(node);
  r.held_since.push_back(now_);
  r.ready_at.push_back(now_ + j.restore);
  if (j.kind != JobKind::kInference) StartIfComplete(job);
}

void OnlineSim::StartIfComplete(uint32_t job) {
  JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  if (r.phase != Phase::kWaiting || r.nodes.size() < j.nodes) return;
  // The gang runs at the speed of its slowest type, slower if spread over racks.
  double speed = 1.0;
  int type = world_.nodes[r.nodes[0]].type;
  bool spread = false;
  for (uint32_t n : r.nodes) {
    double s = j.speed[static_cast<size_t>(world_.nodes[n].type)];
    if (s < speed) {
      speed = s;
      type = world_.nodes[n].type;
    }
    spread |= world_.nodes[n].rack != world_.nodes[r.nodes[0]].rack;
  }
  if (speed <= 0) return;
  r.type = type;
  r.eff = speed * (spread ? j.spread_factor : 1.0);
  if (r.ran && r.lost_since_run) ++r.out.migrations;
  r.lost_since_run = false;
  r.out.last_type = type;
  r.phase = Phase::kStarting;
  ++r.version;
  Push(now_ + j.restore, Ev::kReady, job, r.version);
}

void OnlineSim::BeginRun(uint32_t job) {
  JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  r.phase = Phase::kRunning;
  r.run_start = now_;
  r.base = r.committed;
  r.ran = true;
  ++r.version;
  // When the remaining work completes, counting the save pauses between commits.
  const double need_h = (j.ideal_hours - r.base) / r.eff;  // Work time in hours.
  double tau_h;
  if (j.ckpt_interval > 0) {
    const double c = static_cast<double>(j.ckpt_interval) / kHour;
    const double cyc = c + static_cast<double>(j.ckpt_save) / kHour;
    double full = std::floor(need_h / c);
    double left = need_h - full * c;
    if (left <= 1e-12) tau_h = full * cyc - (cyc - c);
    else tau_h = full * cyc + left;
  } else {
    tau_h = need_h;
  }
  Micros done_at = now_ + static_cast<Micros>(std::ceil(std::max(0.0, tau_h) * kHour));
  Push(done_at, Ev::kComplete, job, r.version);
}

void OnlineSim::StopRun(uint32_t job, bool clean) {
  JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  if (r.phase == Phase::kRunning || r.phase == Phase::kSaving) {
    double d = DoneAt(r, j, now_), c = CommittedAt(r, j, now_);
    if (clean) {
      r.committed = d;
    } else {
      r.committed = c;
      r.out.lost_work_hours += (d - c) * j.nodes;
    }
  }
  if (r.phase != Phase::kDone && r.phase != Phase::kPending) r.phase = Phase::kWaiting;
  ++r.version;
  ++r.yield_version;
  r.yield_at = -1;
  r.resume_after_save = false;
}

void OnlineSim::RevokeNode(uint32_t job, uint32_t node, bool clean, bool evicted) {
  JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  auto it = std::find(r.nodes.begin(), r.nodes.end(), node);
  if (it == r.nodes.end() || holder_[node] != static_cast<int32_t>(job)) return;
  size_t i = static_cast<size_t>(it - r.nodes.begin());
  if (j.kind == JobKind::kInference) AccrueInference(job);
  // Held-time accounting.
  Micros dt = now_ - holder_since_[node];
  held_time_total_ += dt;
  energy_wh_ += world_.types[static_cast<size_t>(world_.nodes[node].type)].power_w * static_cast<double>(dt) / kHour;
  Price p = HeldPrice(job, world_.nodes[node].type);
  if (p > 0) r.out.cost += static_cast<Money>(static_cast<__int128>(p) * dt / kMicrosPerHour);
  holder_[node] = -1;
  Record(node, -1, static_cast<int32_t>(job));
  r.nodes.erase(it);
  r.held_since.erase(r.held_since.begin() + static_cast<ptrdiff_t>(i));
  r.ready_at.erase(r.ready_at.begin() + static_cast<ptrdiff_t>(i));
  if (evicted) ++r.out.evictions;
  if (r.phase == Phase::kDone || j.kind == JobKind::kInference) return;
  if (r.phase == Phase::kRunning || r.phase == Phase::kSaving || r.phase == Phase::kStarting) {
    StopRun(job, clean);
  }
  r.lost_since_run = true;
}

void OnlineSim::Notice(uint32_t job, uint32_t node, Micros deadline) {
  (void)node;
  JobRun& r = runs_[job];
  const Job& j = world_.jobs[job];
  if (j.kind == JobKind::kInference || r.phase == Phase::kDone) return;
  Micros plan = -1;
  if (r.phase == Phase::kRunning) {
    if (j.ckpt_interval > 0) {
      const Micros cyc = j.ckpt_interval + j.ckpt_save;
      Micros m = (now_ - r.run_start) / cyc;
      Micros tb = r.run_start + (m + 1) * cyc;
      if (tb <= deadline) plan = tb;
    }
    if (plan < 0 && j.ckpt_save > 0 && now_ + j.ckpt_save <= deadline) {
      // An emergency save: progress stops now and is committed when it ends.
      r.frozen = DoneAt(r, j, now_);
      r.frozen_committed = CommittedAt(r, j, now_);
      r.phase = Phase::kSaving;
      ++r.version;  // Cancels the completion event.
      plan = now_ + j.ckpt_save;
    }
  } else if (r.phase == Phase::kSaving) {
    r.resume_after_save = false;  // Noticed again: stop when the save ends after all.
    plan = r.yield_at;
  } else {
    // Not running: no work to lose, and no reason to leave before the
    // deadline (the contest may still end in our favour, e.g. a gang drops).
    return;
  }
  if (plan < 0) return;  // Loses the uncommitted work at the deadline.
  if (r.yield_at >= 0 && r.yield_at <= plan) return;
  r.yield_at = plan;
  ++r.yield_version;
  Push(plan, Ev::kYield, job, r.yield_version);
}

void OnlineSim::CancelYield(uint32_t job) {
  JobRun& r = runs_[job];
  if (r.yield_at < 0) return;
  if (r.phase == Phase::kSaving) {
    // The save still completes (at `yield_at`); then the job carries on where
    // it is, on the same nodes: no restore.
    r.resume_after_save = true;
    return;
  }
  r.yield_at = -1;
  ++r.yield_version;
}

void OnlineSim::Tick() {
  const Micros lookahead = 5 * kMinute;
  for (uint32_t j : inference_jobs_) {
    if (runs_[j].phase == Phase::kPending || runs_[j].phase == Phase::kDone) continue;
    AccrueInference(j);
    double target = 0;
    for (Micros t = now_; t <= now_ + lookahead; t += kMinute) target = std::max(target, InferenceNeed(j, t));
    // Scale down only after a stabilization window (like Kubernetes' HPA
    // default of 5 minutes): the fleet follows the highest recent target.
    auto& recent = runs_[j].recent_targets;
    recent.push_back(target);
    const size_t window = static_cast<size_t>(std::max<Micros>(1, 5 * kMinute / world_.tick));
    if (recent.size() > window) recent.erase(recent.begin());
    for (double x : recent) target = std::max(target, x);
    OnAutoscale(j, target * world_.autoscale_headroom);
  }
  if (options_.sample_power) {
    std::vector<int64_t> rows(world_.rows.size(), 0);
    for (size_t n = 0; n < world_.nodes.size(); ++n) {
      if (holder_[n] >= 0)
        rows[static_cast<size_t>(world_.nodes[n].row)] += world_.types[static_cast<size_t>(world_.nodes[n].type)].power_w;
    }
    result_.metrics.sample_times.push_back(now_);
    result_.metrics.row_power.push_back(std::move(rows));
  }
  for (const RowCap& rc : world_.power_caps) {
    int64_t p = 0;
    for (size_t n = 0; n < world_.nodes.size(); ++n)
      if (holder_[n] >= 0 && world_.nodes[n].row == rc.row)
        p += world_.types[static_cast<size_t>(world_.nodes[n].type)].power_w;
    if (p > rc.cap_w) result_.metrics.power_violation_minutes += static_cast<uint64_t>(world_.tick / kMinute);
  }
  OnTick();
  if (options_.progress) options_.progress(static_cast<double>(now_) / static_cast<double>(world_.horizon));
}

Result<RunResult> OnlineSim::Execute(const std::string& mechanism_name) {
  result_ = RunResult{};
  result_.mechanism = mechanism_name;
  runs_.assign(world_.jobs.size(), JobRun{});
  holder_.assign(world_.nodes.size(), -1);
  holder_since_.assign(world_.nodes.size(), 0);
  open_batch_ = 0;
  inference_jobs_.clear();
  for (uint32_t j = 0; j < world_.jobs.size(); ++j) {
    if (world_.jobs[j].kind == JobKind::kInference) inference_jobs_.push_back(j);
    runs_[j].out.job = j;
    runs_[j].out.kind = world_.jobs[j].kind;
    if (IsBatch(j)) ++open_batch_;
    Push(world_.jobs[j].arrival, Ev::kArrival, j);
  }
  LZ_RETURN_IF_ERROR(Start());
  Push(0, Ev::kTick, 0);
  // A drained run goes on past the horizon until every batch job is done.
  const Micros end = std::max(world_.horizon, world_.drain_limit);
  bool fleets_gone = false;
  Micros last_external = -1;
  while (true) {
    Micros tq = queue_.empty() ? kNever : queue_.top().time;
    Micros tx = NextExternalTime();
    if (tx <= last_external) tx = kNever;  // Guard: the source made no progress.
    Micros t = std::min(tq, tx);
    if (t > world_.horizon) {
      if (end == world_.horizon || open_batch_ == 0 || t > end) break;
      if (!fleets_gone) {
        // The horizon: serving fleets leave and give their nodes back.
        fleets_gone = true;
        now_ = std::max(now_, world_.horizon);
        for (uint32_t j = 0; j < runs_.size(); ++j) {
          if (IsBatch(j) || runs_[j].phase == Phase::kDone || runs_[j].phase == Phase::kPending) continue;
          AccrueInference(j);
          runs_[j].phase = Phase::kDone;
          ++runs_[j].version;
          OnFinished(j);
        }
        continue;
      }
    }
    now_ = std::max(now_, t);
    if (tx <= tq) {
      last_external = tx;
      AdvanceExternal(now_);
      continue;
    }
    Event e = queue_.top();
    queue_.pop();
    JobRun& r = runs_[e.job];
    switch (e.type) {
      case Ev::kArrival:
        r.phase = Phase::kWaiting;
        r.acc_at = now_;
        OnArrival(e.job);
        break;
      case Ev::kReady:
        if (e.version == r.version && r.phase == Phase::kStarting) BeginRun(e.job);
        break;
      case Ev::kComplete:
        if (e.version == r.version && r.phase == Phase::kRunning) {
          r.phase = Phase::kDone;
          r.committed = world_.jobs[e.job].ideal_hours;
          r.out.finish = now_;
          ++r.version;
          --open_batch_;
          OnFinished(e.job);
        }
        break;
      case Ev::kYield:
        if (e.version == r.yield_version && r.yield_at == now_) {
          if (r.phase == Phase::kSaving) r.committed = r.frozen;
          if (r.resume_after_save) {
            // The contest ended during the save: run on from the saved state.
            r.resume_after_save = false;
            r.yield_at = -1;
            ++r.yield_version;
            r.phase = Phase::kWaiting;
            BeginRun(e.job);
            break;
          }
          StopRun(e.job, /*clean=*/true);
          OnYield(e.job);
          StartIfComplete(e.job);  // Nothing was released: carry on.
        }
        break;
      case Ev::kTimer:
        OnTimer(e.job, e.version);
        break;
      case Ev::kTick:
        Tick();
        if (now_ + world_.tick <= end) Push(now_ + world_.tick, Ev::kTick, 0);
        break;
    }
  }
  // The run ends at the horizon, or in a drained run when the last batch job
  // finished (at most at the drain limit).
  now_ = end == world_.horizon ? world_.horizon : std::min(end, std::max(now_, world_.horizon));
  AdvanceExternal(now_);
  // Close the books.
  for (uint32_t j = 0; j < runs_.size(); ++j) {
    JobRun& r = runs_[j];
    const Job& job = world_.jobs[j];
    if (job.kind == JobKind::kInference) {
      AccrueInference(j);
      r.out.retention = r.needed > 0 ? std::min(1.0, r.served / r.needed) : 1.0;
      r.out.value_weight = static_cast<double>(job.value) / kMicroUnits * r.needed;
    } else if (r.out.finish >= 0) {
      r.out.value_weight = static_cast<double>(job.value) / kMicroUnits * job.nodes * job.ideal_hours;
      double actual = static_cast<double>(r.out.finish - job.arrival) / kHour;
      r.out.retention = actual > 0 ? std::min(1.0, job.ideal_hours / actual) : 1.0;
    } else {
      // Unfinished: its average progress rate while in the system (a finished
      // job's D / (finish - arrival) is the same rate).
      r.out.value_weight = static_cast<double>(job.value) / kMicroUnits * job.nodes * job.ideal_hours;
      double done = DoneAt(r, job, now_);
      double life = static_cast<double>(now_ - job.arrival) / kHour;
      r.out.retention = life > 0 ? std::min(1.0, done / life) : 1.0;
    }
    for (size_t i = 0; i < r.nodes.size(); ++i) {
      uint32_t n = r.nodes[i];
      Micros dt = now_ - holder_since_[n];
      held_time_total_ += dt;
      energy_wh_ += world_.types[static_cast<size_t>(world_.nodes[n].type)].power_w * static_cast<double>(dt) / kHour;
      Price p = HeldPrice(j, world_.nodes[n].type);
      if (p > 0) r.out.cost += static_cast<Money>(static_cast<__int128>(p) * dt / kMicrosPerHour);
    }
  }
  RunMetrics& m = result_.metrics;
  m.end = now_;
  const double node_time = static_cast<double>(world_.nodes.size()) * static_cast<double>(now_);
  m.utilization = node_time > 0 ? static_cast<double>(held_time_total_) / node_time : 0;
  m.energy_mwh = energy_wh_ / 1e6;
  const double node_days = static_cast<double>(world_.nodes.size()) * static_cast<double>(now_) / (24 * kHour);
  m.churn_per_node_day = node_days > 0 ? static_cast<double>(grants_) / node_days : 0;
  for (JobRun& r : runs_) result_.jobs.push_back(r.out);
  Finish(&result_);
  m.revenue = 0;
  for (const JobOutcome& o : result_.jobs) m.revenue += o.cost;
  if (options_.progress) options_.progress(1.0);
  return std::move(result_);
}

}  // namespace laissez::sim
