#pragma once
// The one exception hierarchy of the native core (memory, scheduling, batching). The Python
// module maps it once: logic_error -> ValueError, bad_alloc (and out_of_memory) -> MemoryError.
#include <new>
#include <stdexcept>
#include <string>

namespace latte {

// A broken precondition: the caller passed something the interface does not accept.
class logic_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// std::bad_alloc carries no message; ours does, so users see the sizes involved.
class bad_alloc : public std::bad_alloc {
 public:
  explicit bad_alloc(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// The resource had no room for the request (as opposed to an upstream failure).
class out_of_memory : public bad_alloc {
 public:
  using bad_alloc::bad_alloc;
};

}  // namespace latte

#define LATTE_STRINGIFY_DETAIL(x) #x
#define LATTE_STRINGIFY(x) LATTE_STRINGIFY_DETAIL(x)

// Precondition check that names the failing line, so a bad call is found without a debugger.
#define LATTE_EXPECTS(condition, message)                                                 \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      throw ::latte::logic_error(std::string("latte: " __FILE__ ":" LATTE_STRINGIFY(__LINE__) \
                                             ": ") +                                      \
                                 (message));                                              \
    }                                                                                     \
  } while (0)
