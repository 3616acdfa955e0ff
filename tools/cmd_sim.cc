// `laissez simulate` and `laissez experiment`: the simulator's commands.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "market/operation.h"
#ifdef LAISSEZ_HAVE_OPLOG
#include "oplog/oplog.h"
#endif

#include "sim/experiments.h"
#include "sim/mechanism.h"
#include "tools/commands.h"

namespace laissez::cli {

void RegisterSimCommands(CLI::App& app, int* exit_code) {
  auto log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };

  {
    auto* cmd = app.add_subcommand("simulate", "Run a scenario under one or all mechanisms");
    auto scenario = std::make_shared<std::string>();
    auto mechanism = std::make_shared<std::string>("all");
    auto seed = std::make_shared<uint64_t>(1);
    auto out = std::make_shared<std::string>("out");
    cmd->add_option("scenario", *scenario, "Scenario YAML file")->required();
    std::string mech_help;
    for (const std::string& m : sim::MechanismNames()) mech_help += m + ", ";
    cmd->add_option("--mechanism", *mechanism, mech_help + "or all");
    cmd->add_option("--seed", *seed, "Random seed");
    cmd->add_option("--out", *out, "Output directory (summary.csv, jobs.csv)");
    auto oplog = std::make_shared<std::string>();
#ifdef LAISSEZ_HAVE_OPLOG
    cmd->add_option("--oplog", *oplog,
                    "Write the LaissezCloud run's engine operations to FILE (docs/OPLOG.md; laissez replay reads it)");
#endif
    cmd->callback([=] {
      std::vector<std::string> mechs;
      if (*mechanism == "all") mechs = sim::MechanismNames();
      else mechs = {*mechanism};
      market::OperationObserver observer;
      std::shared_ptr<std::ofstream> file;
#ifdef LAISSEZ_HAVE_OPLOG
      if (!oplog->empty()) {
        file = std::make_shared<std::ofstream>(*oplog, std::ios::binary | std::ios::trunc);
        if (!*file) {
          std::fprintf(stderr, "simulate: --oplog: cannot write '%s'\n", oplog->c_str());
          *exit_code = 1;
          return;
        }
        auto line = std::make_shared<std::string>();
        observer = [file, line](const market::Operation& op, uint64_t created_id) {
          line->clear();
          oplog::AppendOperation(op, created_id, line.get());
          *file << *line << '\n';
        };
      }
#endif
      Status s = sim::Simulate(*scenario, mechs, *seed, *out, log, observer);
      if (file) file->flush();
      if (file && !*file) s = DataLoss("--oplog: write to '" + *oplog + "' failed");
      if (!s.ok()) {
        std::fprintf(stderr, "simulate: %s\n", s.ToString().c_str());
        *exit_code = 1;
        return;
      }
      std::fprintf(stderr, "wrote %s/summary.csv and %s/jobs.csv\n", out->c_str(), out->c_str());
    });
  }
  {
    auto* cmd = app.add_subcommand("experiment", "Reproduce one of the paper's experiments (or all)");
    auto name = std::make_shared<std::string>();
    auto quick = std::make_shared<bool>(false);
    auto out = std::make_shared<std::string>("out");
    auto seed = std::make_shared<uint64_t>(1);
    auto seeds = std::make_shared<size_t>(0);
    auto scale_nodes = std::make_shared<int>(0);
    auto scale_days = std::make_shared<int>(0);
    std::string names = "all";
    for (const std::string& n : sim::ExperimentNames()) names += ", " + n;
    cmd->add_option("name", *name, names)->required();
    cmd->add_flag("--quick", *quick, "Small sizes (experiment all --quick takes at most 3 minutes)");
    cmd->add_option("--out", *out, "Output directory (NAME.csv, NAME.png, NAME.svg, report.md)");
    cmd->add_option("--seed", *seed, "First random seed");
    cmd->add_option("--seeds", *seeds,
                    "Paired seeds per cell of fig6, azure-llm, robustness and heldout (seed, seed+1, ...; "
                    "default 3 with --quick, else 10)")
        ->check(CLI::Range(size_t{1}, size_t{1000}));
    cmd->add_option("--scale-nodes", *scale_nodes,
                    "scale: run one case of this many nodes (default 10000) instead of the fixed cases")
        ->check(CLI::Range(100, 1'000'000));
    cmd->add_option("--scale-days", *scale_days,
                    "scale: simulated days of that one case (default 1 with --quick, else 7)")
        ->check(CLI::Range(1, 28));
    cmd->callback([=] {
      sim::ExperimentOptions o;
      o.quick = *quick;
      o.out_dir = *out;
      o.seed = *seed;
      o.seeds = *seeds;
      o.scale_nodes = *scale_nodes;
      o.scale_days = *scale_days;
      o.log = log;
      Status s = sim::RunExperiment(*name, o);
      if (!s.ok()) {
        std::fprintf(stderr, "experiment: %s\n", s.ToString().c_str());
        *exit_code = 1;
        return;
      }
      std::fprintf(stderr, "report: %s/report.md\n", out->c_str());
    });
  }
}

}  // namespace laissez::cli
