#pragma once
// The parts of latte._native, one bindings file each; module.cpp assembles them.
#include <nanobind/nanobind.h>

void bind_memory(nanobind::module_& m);      // memory_bindings.cpp
void bind_scheduling(nanobind::module_& m);  // scheduling_bindings.cpp
void bind_batching(nanobind::module_& m);    // batching_bindings.cpp
