// The one file that exposes the C++ core to Python as latte._native.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "latte/build_info.hpp"

namespace nb = nanobind;

NB_MODULE(_native, m) {
  m.doc() = "Latte's native core (private: import through latte.memory / latte.scheduling)";

  m.def("build_info", [] {
    latte::BuildInfo info = latte::build_info();
    nb::dict d;
    d["version"] = info.version;
    d["compiler"] = info.compiler;
    d["debug_checks"] = info.debug_checks;
    d["cuda"] = info.cuda;
    return d;
  }, "Version and features of this build of the native core.");

  // --- memory (BuddyArena) ---

  // --- scheduling (AffinityScheduler) ---
}
