// latte._native: the C++ core exposed to Python. This file defines the module, its build
// information and the one mapping of the core's exceptions (latte/error.hpp) to Python's.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#define LATTE_NUMPY_IMPORTS_TABLE
#include "numpy_api.hpp"

#include "bindings.hpp"
#include "latte/build_info.hpp"
#include "latte/error.hpp"

namespace nb = nanobind;

NB_MODULE(_native, m) {
  m.doc() = "Latte's native core (private: import through latte.memory / latte.scheduling)";
  if (_import_array() < 0) throw nb::python_error();

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const latte::bad_alloc& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const latte::logic_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("build_info", [] {
    latte::BuildInfo info = latte::build_info();
    nb::dict d;
    d["version"] = info.version;
    d["compiler"] = info.compiler;
    d["debug_checks"] = info.debug_checks;
    d["cuda"] = info.cuda;
    return d;
  }, "Version and features of this build of the native core.");

  bind_memory(m);
  bind_batching(m);
  bind_scheduling(m);
}
