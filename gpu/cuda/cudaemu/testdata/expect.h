// EXPECT for the emulator's C++ tests: count and report a failed check.
#pragma once
#include <cstdio>

static int failures;
#define EXPECT(cond, ...)                    \
  do {                                       \
    if (!(cond)) {                           \
      fprintf(stderr, "FAIL: " __VA_ARGS__); \
      fprintf(stderr, "\n");                 \
      failures++;                            \
    }                                        \
  } while (0)
