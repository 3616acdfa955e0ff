// CHECK: aborts with a message when an internal invariant is broken. Never used
// to validate input; public entry points return Status for that.
#pragma once

#include <cstdio>
#include <cstdlib>

#define LZ_CHECK(cond)                                                            \
  do {                                                                            \
    if (!(cond)) [[unlikely]] {                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)
