#pragma once
// The C++ suites' test harness: CHECK (and CHECK_EQ, which prints both values, and
// CHECK_THROWS_AS) records a failure with file:line and keeps going; SKIP ends a test case that
// cannot run here (no device) and says why. The executable exits 1 when a check failed, else
// SKIPPED_EXIT (77, which CTest's SKIP_RETURN_CODE counts as skipped) when a case was skipped,
// else 0.
#include <atomic>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace latte::testing {

// The exit status of a run with no failed check and at least one case skipped.
constexpr int SKIPPED_EXIT = 77;

// Thrown by SKIP: the rest of the case does not run, and the run counts it as skipped.
struct Skipped {
  std::string reason;
};

// Failed checks so far; a check may fail on any thread.
inline std::atomic<int>& failures() {
  static std::atomic<int> count{0};
  return count;
}

struct TestCase {
  const char* name;
  std::function<void()> body;
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Register {
  Register(const char* name, std::function<void()> body) { registry().push_back({name, std::move(body)}); }
};

inline int run_all() {
  std::size_t skipped = 0;
  for (const TestCase& test : registry()) {
    const int before = failures();
    try {
      test.body();
    } catch (const Skipped& skip) {
      // Checks that failed before the skip still fail the run.
      if (failures() == before) {
        ++skipped;
        std::printf("SKIP %s: %s\n", test.name, skip.reason.c_str());
        continue;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "  unexpected exception: %s\n", e.what());
      ++failures();
    }
    std::printf("%s %s\n", failures() == before ? "PASS" : "FAIL", test.name);
  }
  std::printf("%zu tests, %zu skipped, %d failed checks\n", registry().size(), skipped, failures().load());
  if (failures() != 0) return 1;
  return skipped == 0 ? 0 : SKIPPED_EXIT;
}

}  // namespace latte::testing

#define LATTE_TEST_CONCAT2(a, b) a##b
#define LATTE_TEST_CONCAT(a, b) LATTE_TEST_CONCAT2(a, b)
#define TEST_CASE(name)                                                                \
  static void LATTE_TEST_CONCAT(test_body_, __LINE__)();                               \
  static ::latte::testing::Register LATTE_TEST_CONCAT(test_reg_, __LINE__)(            \
      name, LATTE_TEST_CONCAT(test_body_, __LINE__));                                  \
  static void LATTE_TEST_CONCAT(test_body_, __LINE__)()

// Ends the test case as skipped, with the reason printed beside its name.
#define SKIP(reason) throw ::latte::testing::Skipped{reason}

#define CHECK(condition)                                                                \
  do {                                                                                  \
    if (!(condition)) {                                                                 \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
      ++::latte::testing::failures();                                                   \
    }                                                                                   \
  } while (0)

// Operands are copied: `core.metrics().steals` is a member of a temporary that a reference
// would outlive.
#define CHECK_EQ(a, b)                                                                  \
  do {                                                                                  \
    const auto check_a = (a);                                                           \
    const auto check_b = (b);                                                           \
    if (!(check_a == check_b)) {                                                        \
      std::ostringstream check_os;                                                      \
      check_os << check_a << " != " << check_b;                                         \
      std::fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %s\n", __FILE__, __LINE__,  \
                   #a, #b, check_os.str().c_str());                                     \
      ++::latte::testing::failures();                                                   \
    }                                                                                   \
  } while (0)

#define CHECK_THROWS_AS(expression, exception_type)                                      \
  do {                                                                                  \
    bool caught = false;                                                                \
    try {                                                                               \
      (void)(expression);                                                               \
    } catch (const exception_type&) {                                                   \
      caught = true;                                                                    \
    }                                                                                   \
    if (!caught) {                                                                      \
      std::fprintf(stderr, "%s:%d: expected %s from %s\n", __FILE__, __LINE__,          \
                   #exception_type, #expression);                                       \
      ++::latte::testing::failures();                                                   \
    }                                                                                   \
  } while (0)
