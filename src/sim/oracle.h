// OracleBound: an upper bound on the mean retention any allocation policy can
// achieve on a World. It solves, with COIN-OR CLP, a linear relaxation over
// the whole horizon that knows the future, pays no overheads (no restore, no
// checkpoint saves, no lost work), ignores integrality, gang shape, racks and
// the one-type-per-gang rule:
//
//   y[j,h,e] >= 0   node-hours of type h given to job j in epoch e
//   sum_j y[j,h,e] <= N_h x len_e                    (capacity)
//   sum_h y[j,h,e] <= k_j x avail_{j,e}              (a batch job uses <= k nodes, after arrival)
//   batch j: z[j,e] in [0,1] fraction completing in e (0 if e ends before a_j + D_j),
//            u_j = 1 - sum_e z[j,e], w_j <= u_j
//     D_j x sum_{e'<=e} z[j,e'] <= sum_{e'<=e} sum_h s_jh y[j,h,e'] / k_j   (work before completion)
//     w_j x min(D_j, H - a_j) <= sum_e sum_h s_jh y[j,h,e] / k_j           (unfinished: progress)
//     value_j = sum_e z[j,e] min(1, D_j / (t_e - a_j)) + w_j
//   inference j: served[j,e] <= need_j(e), served[j,e] <= sum_h s_jh y[j,h,e]
//     value_j = sum_e served[j,e] / sum_e need_j(e)
//   maximize sum_j value_j / J.
//
// Why it bounds every schedule: any real schedule gives a feasible point
// (z = 1 in the epoch of completion, which ends at or after a_j + D_j since no
// job finishes faster than alone on its preferred hardware, and whose start t_e is at or before the
// completion time, so its coefficient is at least the job's real retention;
// u = 1 and w = its progress ratio if unfinished; served = what it served),
// and the objective there is at least the schedule's mean retention.
// A per-epoch heuristic would not be a bound; this is not one.
#pragma once

#include "sim/mechanism.h"

namespace laissez::sim {

class OracleBound final : public Mechanism {
 public:
  std::string name() const override { return "oracle"; }
  Result<RunResult> Run(const World& world, const RunOptions& options) override;
};

}  // namespace laissez::sim
