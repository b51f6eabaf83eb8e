#pragma once
// Minimal test harness: CHECK records a failure with file:line and keeps going; the test
// executable's exit status says whether any check failed.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace latte::testing {

inline int& failures() {
  static int count = 0;
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
  for (const TestCase& test : registry()) {
    const int before = failures();
    try {
      test.body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "  unexpected exception: %s\n", e.what());
      ++failures();
    }
    std::printf("%s %s\n", failures() == before ? "PASS" : "FAIL", test.name);
  }
  std::printf("%zu tests, %d failed checks\n", registry().size(), failures());
  return failures() == 0 ? 0 : 1;
}

}  // namespace latte::testing

#define LATTE_TEST_CONCAT2(a, b) a##b
#define LATTE_TEST_CONCAT(a, b) LATTE_TEST_CONCAT2(a, b)
#define TEST_CASE(name)                                                                \
  static void LATTE_TEST_CONCAT(test_body_, __LINE__)();                               \
  static ::latte::testing::Register LATTE_TEST_CONCAT(test_reg_, __LINE__)(            \
      name, LATTE_TEST_CONCAT(test_body_, __LINE__));                                  \
  static void LATTE_TEST_CONCAT(test_body_, __LINE__)()

#define CHECK(condition)                                                                \
  do {                                                                                  \
    if (!(condition)) {                                                                 \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
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
