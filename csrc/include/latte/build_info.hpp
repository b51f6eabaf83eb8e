#pragma once
// What this build of the native core contains, so Python can report and test it.
#include <string>

namespace latte {

struct BuildInfo {
  std::string version;
  std::string compiler;
  bool debug_checks;  // invariants re-checked after every operation
  bool cuda;          // CUDA memory resources compiled in
};

BuildInfo build_info();

}  // namespace latte
