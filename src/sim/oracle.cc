#include "sim/oracle.h"

#include <coin/ClpSimplex.hpp>
#include <coin/CoinPackedMatrix.hpp>

#include <algorithm>
#include <cmath>

namespace laissez::sim {
namespace {
constexpr double kHour = static_cast<double>(kMicrosPerHour);
}

Result<RunResult> OracleBound::Run(const World& w, const RunOptions& options) {
  RunResult result;
  result.mechanism = name();
  result.bound = true;
  // A drained run (World::drain_limit) lets batch jobs finish after the
  // horizon; so does the bound.
  const double H = static_cast<double>(std::max(w.horizon, w.drain_limit)) / kHour;
  // Epochs: about 48 over the horizon, at least 15 minutes each; past the
  // horizon (a drained run) each epoch is twice as long as the one before, to
  // keep the LP small. Any partition gives a bound: a completion is credited
  // at its epoch's start.
  const double H0 = static_cast<double>(w.horizon) / kHour;
  const double len = std::max(0.25, H0 / 48.0);
  std::vector<double> bounds = {0};
  while (bounds.back() < H - 1e-9) {
    double step = bounds.back() < H0 - 1e-9 ? len : 2 * (bounds.back() - bounds[bounds.size() - 2]);
    bounds.push_back(std::min(H, bounds.back() + step));
  }
  const int E = static_cast<int>(bounds.size()) - 1;
  auto t_start = [&](int e) { return bounds[static_cast<size_t>(e)]; };
  auto t_end = [&](int e) { return bounds[static_cast<size_t>(e) + 1]; };
  auto epoch_of = [&](double t) {
    int e = static_cast<int>(std::upper_bound(bounds.begin(), bounds.end(), t) - bounds.begin()) - 1;
    return std::clamp(e, 0, E - 1);
  };
  const size_t T = w.types.size();
  std::vector<double> type_nodes(T, 0);
  for (const SimNode& n : w.nodes) type_nodes[static_cast<size_t>(n.type)] += 1;

  std::vector<double> collb, colub, obj;
  std::vector<int> rows, cols;
  std::vector<double> vals;
  std::vector<double> rowlb, rowub;
  auto add_col = [&](double lb, double ub, double c) {
    collb.push_back(lb);
    colub.push_back(ub);
    obj.push_back(c);
    return static_cast<int>(obj.size()) - 1;
  };
  auto add_row = [&](double lb, double ub) {
    rowlb.push_back(lb);
    rowub.push_back(ub);
    return static_cast<int>(rowlb.size()) - 1;
  };
  auto coef = [&](int r, int c, double v) {
    rows.push_back(r);
    cols.push_back(c);
    vals.push_back(v);
  };
  // Capacity rows, one per (type, epoch).
  std::vector<int> cap_row(T * static_cast<size_t>(E));
  for (size_t h = 0; h < T; ++h)
    for (int e = 0; e < E; ++e) cap_row[h * static_cast<size_t>(E) + static_cast<size_t>(e)] = add_row(-COIN_DBL_MAX, type_nodes[h] * (t_end(e) - t_start(e)));

  const size_t J = w.jobs.size();
  // Per-job value columns to read back: (job, column, coefficient).
  std::vector<std::vector<std::pair<int, double>>> value_cols(J);
  std::vector<double> weights(J, 0);  // JobOutcome::value_weight.
  for (size_t j = 0; j < J; ++j) {
    const Job& job = w.jobs[j];
    const double a = static_cast<double>(job.arrival) / kHour;
    const bool inf = job.kind == JobKind::kInference;
    double need_total = 0;
    std::vector<double> need_e(static_cast<size_t>(E), 0);
    if (inf) {
      for (size_t m = 0; m < job.need.size(); ++m) {
        double t0 = static_cast<double>(m) / 60.0;
        if (t0 >= H) break;
        double dt = std::min(1.0 / 60.0, H - t0);
        int e = epoch_of(t0);
        // A minute may straddle epochs only if len is not a whole number of minutes; len is.
        need_e[static_cast<size_t>(e)] += job.need[m] * dt;
        need_total += job.need[m] * dt;
      }
    }
    const double k = std::max<double>(1, job.nodes);
    const double D = job.ideal_hours;
    weights[j] = static_cast<double>(job.value) / kMicroUnits * (inf ? need_total : job.nodes * D);
    // Work columns y[j,h,e] and per-epoch rows.
    std::vector<std::vector<std::pair<int, double>>> work_e(static_cast<size_t>(E));  // (col, progress coef)
    for (int e = 0; e < E; ++e) {
      double avail = std::max(0.0, t_end(e) - std::max(t_start(e), a));
      if (avail <= 0) continue;
      int per_job = inf ? -1 : add_row(-COIN_DBL_MAX, k * avail);
      for (size_t h = 0; h < T; ++h) {
        if (job.speed[h] <= 0) continue;
        int c = add_col(0, COIN_DBL_MAX, 0);
        coef(cap_row[h * static_cast<size_t>(E) + static_cast<size_t>(e)], c, 1.0);
        if (per_job >= 0) coef(per_job, c, 1.0);
        work_e[static_cast<size_t>(e)].emplace_back(c, inf ? job.speed[h] : job.speed[h] / k);
      }
    }
    if (inf) {
      if (need_total <= 0) continue;
      for (int e = 0; e < E; ++e) {
        if (need_e[static_cast<size_t>(e)] <= 0 || work_e[static_cast<size_t>(e)].empty()) continue;
        int s = add_col(0, need_e[static_cast<size_t>(e)], 1.0 / need_total);
        value_cols[j].emplace_back(s, 1.0 / need_total);
        int r = add_row(-COIN_DBL_MAX, 0);  // s - sum speed y <= 0
        coef(r, s, 1.0);
        for (auto& [c, v] : work_e[static_cast<size_t>(e)]) coef(r, c, -v);
      }
      continue;
    }
    // Batch: completion fractions and the unfinished part.
    int sum_row = add_row(1.0, 1.0);  // sum z + u = 1
    int u = add_col(0, 1, 0);
    coef(sum_row, u, 1.0);
    const double life_h = std::max(1e-9, H - a);
    int wcol = add_col(0, 1, 1.0);
    value_cols[j].emplace_back(wcol, 1.0);
    int wu = add_row(-COIN_DBL_MAX, 0);  // w - u <= 0
    coef(wu, wcol, 1.0);
    coef(wu, u, -1.0);
    // w (H - a) + D sum z - sum progress <= 0: the unfinished fraction's credit
    // comes from progress beyond what the completing fractions used.
    int wp = add_row(-COIN_DBL_MAX, 0);
    coef(wp, wcol, life_h);
    // Cumulative completion Zc_e = Zc_{e-1} + z_e and progress P_e = P_{e-1} + work_e,
    // with D x Zc_e <= P_e (linear in E per job).
    int prev_zc = -1, prev_p = -1;
    for (int e = 0; e < E; ++e) {
      double te = t_start(e);
      double v = te <= a ? 1.0 : std::min(1.0, D / (te - a));
      // No job completes before arrival + D, so no fraction may either:
      // without this a job running from arrival would credit every fraction
      // with retention 1 (each needs only its share of the work).
      int z = add_col(0, t_end(e) + 1e-9 >= a + D ? 1.0 : 0.0, v);
      value_cols[j].emplace_back(z, v);
      coef(sum_row, z, 1.0);
      coef(wp, z, D);
      for (auto& [c, pv] : work_e[static_cast<size_t>(e)]) coef(wp, c, -pv);
      int zc = add_col(0, 1, 0), p = add_col(0, COIN_DBL_MAX, 0);
      int rz = add_row(0, 0);  // zc - prev_zc - z = 0
      coef(rz, zc, 1.0);
      coef(rz, z, -1.0);
      if (prev_zc >= 0) coef(rz, prev_zc, -1.0);
      int rp = add_row(0, 0);  // p - prev_p - work_e = 0
      coef(rp, p, 1.0);
      if (prev_p >= 0) coef(rp, prev_p, -1.0);
      for (auto& [c, pv] : work_e[static_cast<size_t>(e)]) coef(rp, c, -pv);
      int cum = add_row(-COIN_DBL_MAX, 0);  // D zc - p <= 0
      coef(cum, zc, D);
      coef(cum, p, -1.0);
      prev_zc = zc;
      prev_p = p;
    }
  }
  if (options.progress) options.progress(0.2);
  CoinPackedMatrix m(false, rows.data(), cols.data(), vals.data(), static_cast<CoinBigIndex>(vals.size()));
  // Make sure the matrix has every row and column.
  m.setDimensions(static_cast<int>(rowlb.size()), static_cast<int>(obj.size()));
  ClpSimplex lp;
  lp.setLogLevel(0);
  lp.loadProblem(m, collb.data(), colub.data(), obj.data(), rowlb.data(), rowub.data());
  lp.setOptimizationDirection(-1);  // Maximize.
  lp.dual();
  if (!lp.isProvenOptimal()) lp.primal();
  if (!lp.isProvenOptimal()) return Internal("oracle: the LP relaxation was not solved to optimality");
  const double* x = lp.primalColumnSolution();
  for (size_t j = 0; j < J; ++j) {
    JobOutcome o;
    o.job = static_cast<uint32_t>(j);
    o.kind = w.jobs[j].kind;
    double v = 0;
    for (auto& [c, coefv] : value_cols[j]) v += x[c] * coefv;
    if (w.jobs[j].kind == JobKind::kInference && value_cols[j].empty()) v = 1.0;
    o.retention = std::clamp(v, 0.0, 1.0);
    o.value_weight = weights[j];
    result.jobs.push_back(o);
  }
  if (options.progress) options.progress(1.0);
  return result;
}

}  // namespace laissez::sim
