// Summaries of runs and their CSV form. Numbers are printed with fixed
// precision so that equal runs give byte-identical files.
#pragma once

#include <string>
#include <vector>

#include "sim/mechanism.h"

namespace laissez::sim {

struct Summary {
  std::string mechanism;
  bool bound = false;
  size_t jobs = 0;
  double mean_retention = 0, p10_retention = 0;
  // Retention weighted by each job's money value of full performance (welfare).
  double value_weighted_retention = 0;
  size_t unfinished = 0;  // Batch jobs not finished when the run stopped.
  double mean_cost = 0;  // Units of money per job.
  uint64_t migrations = 0, evictions = 0;
  double lost_work_hours = 0;
  double utilization = 0;
  double revenue = 0;  // Units of money.
  uint64_t power_violation_minutes = 0;
  double energy_mwh = 0;
  double churn_per_node_day = 0;
};

Summary Summarize(const RunResult& r);
// The same over a subset of jobs (by predicate on the job index).
Summary SummarizeIf(const RunResult& r, const std::vector<bool>& include);
double Percentile(std::vector<double> v, double p);

std::string Fmt(double v, int decimals = 4);
std::string SummaryCsvHeader();
std::string SummaryCsvRow(const Summary& s);
// Per-job detail: job,kind,nodes,arrival_h,retention,cost,migrations,evictions,lost_work_hours,finish_h,last_type.
std::string JobsCsv(const World& w, const RunResult& r);

}  // namespace laissez::sim
