// OnlineSim: the discrete-event core shared by the online mechanisms. It owns
// virtual time, the event queue, the jobs' progress (checkpoints, restores,
// lost work), the inference fleets and their autoscalers, and the metrics; a
// subclass decides who gets which node (GrantNode / RevokeNode) and reacts to
// arrivals, completions, notices and ticks.
//
// Job progress model (all mechanisms alike). A batch job needs all `nodes` of
// its gang, on one type, to run. After it gets them it restores for `restore`
// (scaled by nothing: the true overhead), then works at speed[type] (x
// spread_factor if the gang spans racks) in cycles of `ckpt_interval` of work
// followed by a blocking save of `ckpt_save`; work is committed at the end of
// each save. Losing a node without warning loses the work since the last
// commit. A notice with deadline d lets the job stop cleanly: at the next
// commit if it falls before d, else by an emergency save if one fits, else it
// loses the uncommitted work at d. An inference fleet serves min(capacity,
// need) where capacity is the sum of speed over its ready nodes.
//
// Invariants: a node has at most one holder; a job's progress never exceeds
// its work; events are processed in (time, sequence) order.
#pragma once

#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "sim/mechanism.h"
#include "sim/world.h"

namespace laissez::sim {

class OnlineSim {
 public:
  OnlineSim(const World& world, const RunOptions& options);
  virtual ~OnlineSim() = default;
  Result<RunResult> Execute(const std::string& mechanism_name);

 protected:
  enum class Phase : uint8_t { kPending, kWaiting, kStarting, kRunning, kSaving, kDone };
  struct JobRun {
    Phase phase = Phase::kPending;
    std::vector<uint32_t> nodes;  // Held nodes.
    int type = -1;                // Type of the held nodes (batch).
    double eff = 0;               // Work per hour while running.
    Micros run_start = 0;
    double base = 0;              // Committed work when the run started.
    double frozen = 0;            // Work at the start of an emergency save.
    double committed = 0;         // Committed work while not running.
    uint64_t version = 0;         // Invalidates scheduled ready/complete events.
    Micros yield_at = -1;         // A planned clean stop.
    uint64_t yield_version = 0;   // Invalidates a planned stop.
    double frozen_committed = 0;  // Committed work when an emergency save began.
    bool resume_after_save = false;  // The stop was cancelled mid-save: run on when it ends.
    bool ran = false;             // Has made progress on some node set.
    bool lost_since_run = false;  // Lost nodes since it last ran (the next start is a migration).
    JobOutcome out;
    // Inference.
    std::vector<Micros> ready_at;  // Parallel to `nodes`.
    double served = 0, needed = 0;
    Micros acc_at = 0;
    std::vector<double> recent_targets;  // Autoscaler targets of the last minutes (scale-down window).
    double capacity = 0;  // Sum of speeds of ready nodes.
    // Accounting of held node time at list/spot price (baselines).
    std::vector<Micros> held_since;  // Parallel to `nodes`.
  };

  // ---- Hooks for the mechanism ----
  virtual Status Start() { return Status::Ok(); }
  virtual void OnArrival(uint32_t job) = 0;
  // The job finished: release its nodes (call ReleaseAll or the market equivalent).
  virtual void OnFinished(uint32_t job) = 0;
  // A planned clean stop happened (the job is stopped, nodes still held):
  // release what the notices asked for.
  virtual void OnYield(uint32_t job) = 0;
  // Inference autoscaler: the job wants `target` capacity (preferred-type nodes).
  virtual void OnAutoscale(uint32_t job, double target) = 0;
  virtual void OnTick() {}
  // A timer set with SetTimer fired.
  virtual void OnTimer(uint32_t /*job*/, uint64_t /*tag*/) {}
  // External event source (the market engine).
  virtual Micros NextExternalTime() { return kNever; }
  virtual void AdvanceExternal(Micros) {}
  // Price paid per node-hour on `type` for cost accounting of held time; a
  // mechanism that charges elsewhere (the market) returns 0.
  virtual Price HeldPrice(uint32_t /*job*/, int /*type*/) { return 0; }
  // Final costs and metrics (the market mechanism reads its ledger here).
  virtual void Finish(RunResult*) {}

  // ---- Services ----
  // Gives `node` to `job` (it must be free). Starts the job when its gang is complete.
  void GrantNode(uint32_t job, uint32_t node);
  // Takes `node` from `job`. `clean`: the job stopped at a commit (no work lost);
  // otherwise the uncommitted work is lost and the loss counts as an eviction
  // when `evicted`.
  void RevokeNode(uint32_t job, uint32_t node, bool clean, bool evicted);
  // A notice: `job` may lose `node` at `deadline`. Plans a clean stop if it can.
  void Notice(uint32_t job, uint32_t node, Micros deadline);
  // Calls OnTimer(job, tag) at time `t`.
  void SetTimer(Micros t, uint32_t job, uint64_t tag) { Push(t, Ev::kTimer, job, tag); }
  // Cancels a planned stop (the contest ended in the holder's favour). A save
  // already under way completes; then the job runs on where it is, without a
  // restore (it never moved).
  void CancelYield(uint32_t job);
  // Making progress (or saving) now: a loss would cost work.
  bool IsRunning(uint32_t job) const {
    return runs_[job].phase == Phase::kRunning || runs_[job].phase == Phase::kSaving;
  }
  bool IsBatch(uint32_t job) const { return world_.jobs[job].kind != JobKind::kInference; }
  double WorkDone(uint32_t job) const;
  double Uncommitted(uint32_t job) const;
  // Work left in hours on the preferred type (batch).
  double Remaining(uint32_t job) const;
  Micros now() const { return now_; }
  // Past the horizon of a drained run: fleets have left, batch jobs drain.
  bool Draining() const { return now_ > world_.horizon; }
  // Batch jobs not yet finished (arrived or not).
  uint32_t open_batch_jobs() const { return open_batch_; }
  int32_t holder(uint32_t node) const { return holder_[node]; }
  void Record(uint32_t node, int32_t job, int32_t from);
  double InferenceNeed(uint32_t job, Micros t) const;

  const World& world_;
  RunOptions options_;
  std::vector<JobRun> runs_;
  std::vector<int32_t> holder_;
  std::vector<Micros> holder_since_;
  RunResult result_;

 private:
  enum class Ev : uint8_t { kArrival, kReady, kComplete, kYield, kTick, kTimer };
  struct Event {
    Micros time;
    uint64_t seq;
    Ev type;
    uint32_t job;
    uint64_t version;
    bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };
  void Push(Micros t, Ev type, uint32_t job, uint64_t version = 0);
  void StartIfComplete(uint32_t job);
  void BeginRun(uint32_t job);
  void StopRun(uint32_t job, bool clean);
  void AccrueInference(uint32_t job);
  void Tick();
  double DoneAt(const JobRun& r, const Job& j, Micros t) const;
  double CommittedAt(const JobRun& r, const Job& j, Micros t) const;

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  uint64_t seq_ = 0;
  Micros now_ = 0;
  uint32_t open_batch_ = 0;
  // The serving fleets, ascending: the tick's autoscaler visits only these
  // (a scan of every job each tick grew with the jobs of a week).
  std::vector<uint32_t> inference_jobs_;
  Micros held_time_total_ = 0;  // Node-microseconds held (closed intervals).
  double energy_wh_ = 0;
  uint64_t grants_ = 0;
};

}  // namespace laissez::sim
