#pragma once
// Errors raised by the scheduler; the Python module maps them to ValueError / RuntimeError.
#include <stdexcept>
#include <string>

namespace latte::scheduling {

// A caller broke the contract of an API (bad argument, use after shutdown).
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace latte::scheduling

// Precondition check that names the failing condition and its file:line.
#define LATTE_SCHED_EXPECTS(condition, message)                                      \
  do {                                                                               \
    if (!(condition)) {                                                              \
      throw ::latte::scheduling::InvalidArgument(std::string(__FILE__) + ":" +       \
                                                 std::to_string(__LINE__) + ": " +   \
                                                 (message));                         \
    }                                                                                \
  } while (0)

// Invariants that are re-checked after every mutation in debug builds only.
#ifdef LATTE_DEBUG_CHECKS
#define LATTE_SCHED_INVARIANT(expr) check_invariants_(expr)
#else
#define LATTE_SCHED_INVARIANT(expr) ((void)0)
#endif
