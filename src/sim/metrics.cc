#include "sim/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace laissez::sim {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Nearest rank.
  size_t idx = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) ;
  idx = idx == 0 ? 0 : idx - 1;
  return v[std::min(idx, v.size() - 1)];
}

std::string Fmt(double v, int decimals) {
  char buf[64];
  if (std::fabs(v) < 0.5 * std::pow(10.0, -decimals)) v = 0;  // No "-0.0000".
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

Summary SummarizeIf(const RunResult& r, const std::vector<bool>& include) {
  Summary s;
  s.mechanism = r.mechanism;
  s.bound = r.bound;
  std::vector<double> ret;
  double cost = 0, weighted = 0, weight = 0;
  for (size_t i = 0; i < r.jobs.size(); ++i) {
    if (!include.empty() && !include[i]) continue;
    const JobOutcome& o = r.jobs[i];
    ret.push_back(o.retention);
    weighted += o.value_weight * o.retention;
    weight += o.value_weight;
    if (o.kind != JobKind::kInference && o.finish < 0) ++s.unfinished;
    cost += static_cast<double>(o.cost) / kMicroUnits;
    s.migrations += o.migrations;
    s.evictions += o.evictions;
    s.lost_work_hours += o.lost_work_hours;
  }
  s.jobs = ret.size();
  double sum = 0;
  for (double x : ret) sum += x;
  s.mean_retention = ret.empty() ? 0 : sum / static_cast<double>(ret.size());
  s.p10_retention = Percentile(ret, 0.10);
  s.value_weighted_retention = weight > 0 ? weighted / weight : 0;
  s.mean_cost = ret.empty() ? 0 : cost / static_cast<double>(ret.size());
  s.utilization = r.metrics.utilization;
  s.revenue = static_cast<double>(r.metrics.revenue) / kMicroUnits;
  s.power_violation_minutes = r.metrics.power_violation_minutes;
  s.energy_mwh = r.metrics.energy_mwh;
  s.churn_per_node_day = r.metrics.churn_per_node_day;
  return s;
}

Summary Summarize(const RunResult& r) { return SummarizeIf(r, {}); }

std::string SummaryCsvHeader() {
  return "mechanism,jobs,mean_retention,p10_retention,mean_cost,migrations,evictions,lost_work_hours,"
         "utilization,operator_revenue,power_violation_minutes,energy_mwh,churn_per_node_day,is_bound,"
         "value_weighted_retention,unfinished";
}

std::string SummaryCsvRow(const Summary& s) {
  if (s.bound) {
    // An upper bound on mean retention; the rest is not a schedule's and is left empty.
    // Its weighted retention is not a bound on welfare (the LP maximises the unweighted mean): empty too.
    return s.mechanism + "," + std::to_string(s.jobs) + "," + Fmt(s.mean_retention) + ",,,,,,,,,,,1,,";
  }
  return s.mechanism + "," + std::to_string(s.jobs) + "," + Fmt(s.mean_retention) + "," + Fmt(s.p10_retention) +
         "," + Fmt(s.mean_cost, 2) + "," + std::to_string(s.migrations) + "," + std::to_string(s.evictions) + "," +
         Fmt(s.lost_work_hours, 3) + "," + Fmt(s.utilization) + "," + Fmt(s.revenue, 2) + "," +
         std::to_string(s.power_violation_minutes) + "," + Fmt(s.energy_mwh, 3) + "," + Fmt(s.churn_per_node_day) +
         ",0," + Fmt(s.value_weighted_retention) + "," + std::to_string(s.unfinished);
}

std::string JobsCsv(const World& w, const RunResult& r) {
  std::string out =
      "mechanism,job,kind,nodes,arrival_h,ideal_hours,retention,cost,migrations,evictions,lost_work_hours,finish_h,"
      "last_type\n";
  for (const JobOutcome& o : r.jobs) {
    const Job& j = w.jobs[o.job];
    out += r.mechanism + "," + std::to_string(o.job) + "," + JobKindName(j.kind) + "," + std::to_string(j.nodes) + "," +
           Fmt(static_cast<double>(j.arrival) / kMicrosPerHour, 4) + "," + Fmt(j.ideal_hours, 4) + "," +
           Fmt(o.retention) + "," + Fmt(static_cast<double>(o.cost) / kMicroUnits, 2) + "," +
           std::to_string(o.migrations) + "," + std::to_string(o.evictions) + "," + Fmt(o.lost_work_hours, 3) + "," +
           (o.finish >= 0 ? Fmt(static_cast<double>(o.finish) / kMicrosPerHour, 4) : std::string()) + "," +
           (o.last_type >= 0 ? w.types[static_cast<size_t>(o.last_type)].name : std::string()) + "\n";
  }
  return out;
}

}  // namespace laissez::sim
