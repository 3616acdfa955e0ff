// The paper's two-application story (Fig. 1 and 2), run on the real engine.
// `laissez demo story` prints it; tools/story_test.cc checks its outcome.
#pragma once

#include <cstdio>
#include <vector>

#include "market/market_engine.h"

namespace laissez::cli {

struct StoryOutcome {
  std::vector<market::Event> events;  // Every event the market emitted, in order.
  NodeId hw1, hw2, hw3;
  TenantId a, b;
  Micros notice_time = 0;  // When B's bid first exceeded A's limit.
  Money a_paid = 0, b_paid = 0;
  bool money_conserved = false;
};

// Runs the story; narrates to `out` in plain words unless it is null.
StoryOutcome RunStory(std::FILE* out);

}  // namespace laissez::cli
