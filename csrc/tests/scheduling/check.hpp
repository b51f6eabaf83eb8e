#pragma once
// Just enough of a test harness: named test cases, CHECK with file:line, non-zero exit on failure.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace latte_test {

struct Case {
  const char* name;
  std::function<void()> body;
};

inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}

struct Register {
  Register(const char* name, std::function<void()> body) { cases().push_back({name, body}); }
};

struct Failure {
  std::string message;
};

inline int run_all() {
  int failed = 0;
  for (const Case& c : cases()) {
    try {
      c.body();
      std::printf("ok   %s\n", c.name);
    } catch (const Failure& f) {
      ++failed;
      std::printf("FAIL %s: %s\n", c.name, f.message.c_str());
    } catch (const std::exception& e) {
      ++failed;
      std::printf("FAIL %s: unexpected exception: %s\n", c.name, e.what());
    }
  }
  std::printf("%zu passed, %d failed\n", cases().size() - failed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace latte_test

#define LT_CONCAT2(a, b) a##b
#define LT_CONCAT(a, b) LT_CONCAT2(a, b)
#define TEST_CASE(name)                                                   \
  static void LT_CONCAT(test_, __LINE__)();                               \
  static latte_test::Register LT_CONCAT(reg_, __LINE__)(name, LT_CONCAT(test_, __LINE__)); \
  static void LT_CONCAT(test_, __LINE__)()

#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::ostringstream lt_os;                                                           \
      lt_os << __FILE__ << ":" << __LINE__ << ": CHECK(" #cond ") failed";                \
      throw latte_test::Failure{lt_os.str()};                                             \
    }                                                                                     \
  } while (0)

// Operands are copied: `core.metrics().steals` is a member of a temporary that a reference
// would outlive.
#define CHECK_EQ(a, b)                                                                    \
  do {                                                                                    \
    const auto lt_a = (a);                                                                \
    const auto lt_b = (b);                                                                \
    if (!(lt_a == lt_b)) {                                                                \
      std::ostringstream lt_os;                                                           \
      lt_os << __FILE__ << ":" << __LINE__ << ": CHECK_EQ(" #a ", " #b ") failed: "       \
            << lt_a << " != " << lt_b;                                                    \
      throw latte_test::Failure{lt_os.str()};                                             \
    }                                                                                     \
  } while (0)

#define CHECK_THROWS(expr, exception_type)                                                \
  do {                                                                                    \
    bool lt_threw = false;                                                                \
    try {                                                                                 \
      (void)(expr);                                                                       \
    } catch (const exception_type&) {                                                     \
      lt_threw = true;                                                                    \
    }                                                                                     \
    if (!lt_threw) {                                                                      \
      throw latte_test::Failure{std::string(__FILE__) + ":" + std::to_string(__LINE__) +  \
                                ": expected " #exception_type " from " #expr};            \
    }                                                                                     \
  } while (0)
