// The paper's experiments and the `simulate` command's engine room. Each
// experiment builds its worlds from scenarios/base.yaml (or its own scenario)
// with the overrides documented in docs/EXPERIMENTS.md, runs the mechanisms,
// and writes DIR/NAME.csv (header row), DIR/NAME.png and DIR/NAME.svg
// (gnuplot) and its `## NAME` section of DIR/report.md, with the paper's claim
// beside our result. Outputs are deterministic per seed except the wall-clock
// and memory figures of `scale`.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "market/market_engine.h"

namespace laissez::sim {

struct ExperimentOptions {
  bool quick = false;
  std::string out_dir = "out";
  uint64_t seed = 1;
  size_t seeds = 0;          // Paired seeds per cell (seed, seed + 1, ...); 0: 3 quick, 10 full.
  std::string scenario_dir;  // Where base.yaml and friends live; default: the source tree's scenarios/.
  // `scale` with either set runs the one case nodes x days (defaults 10,000
  // nodes; 1 day with `quick`, else 7) instead of its fixed cases.
  int scale_nodes = 0;
  int scale_days = 0;
  std::function<void(const std::string&)> log;  // Progress lines (stderr).
};

// fig6 fig7 fig8 fig11 fig13 fig14 fig15 azure-llm robustness heldout scale; `all`
// runs every one but heldout (held-out scenarios run only when named).
std::vector<std::string> ExperimentNames();
// Runs one experiment or "all"; updates report.md in the output directory.
Status RunExperiment(const std::string& name, const ExperimentOptions& options);

// `simulate`: runs a scenario under the given mechanisms ("all" expands) and
// writes DIR/summary.csv (one row per mechanism) and DIR/jobs.csv (per job).
// `observer`, if set, sees every engine operation of the LaissezCloud run.
Status Simulate(const std::string& scenario_path, const std::vector<std::string>& mechanisms, uint64_t seed,
                const std::string& out_dir, const std::function<void(const std::string&)>& log,
                market::OperationObserver observer = nullptr);

}  // namespace laissez::sim
