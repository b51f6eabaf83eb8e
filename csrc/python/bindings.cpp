// The one file that exposes the C++ core to Python as latte._native.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include "latte/build_info.hpp"
#include "latte/memory/arena_stack.hpp"
#include "latte/memory/error.hpp"
#include "latte/memory/host_resource.hpp"

namespace nb = nanobind;

// --- memory (BuddyArena) ---
namespace {

using latte::memory::ArenaStack;

// The Python object owns the arena through a shared_ptr; every array handed out holds
// another reference, so the arena outlives the last view of its memory.
struct PyArena {
  std::shared_ptr<ArenaStack> stack;
};

// Owner of one block, kept in the capsule that numpy holds as the array's base.
struct BlockOwner {
  std::shared_ptr<ArenaStack> stack;
  void* ptr;
  std::size_t bytes;
};

PyArena make_arena(std::size_t capacity, const std::string& device, std::size_t min_block,
                   std::optional<std::size_t> limit, bool size_classes, bool prefault) {
  latte::memory::ArenaStackOptions options;
  options.capacity = capacity;
  if (device == "cpu") {
    options.device = latte::memory::Device::cpu;
  } else if (device.rfind("cuda", 0) == 0) {
    options.device = latte::memory::Device::cuda;
    options.device_id = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
  } else {
    throw latte::memory::logic_error("device must be 'cpu' or 'cuda[:N]', got '" + device + "'");
  }
  options.arena.min_block = min_block;
  options.arena.size_classes = size_classes;
  options.limit = limit.value_or(0);
  options.prefault = prefault;
  return PyArena{std::make_shared<ArenaStack>(options)};
}

nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>> allocate_array(PyArena& self, std::size_t bytes) {
  if (self.stack->options().device != latte::memory::Device::cpu) {
    throw latte::memory::logic_error("allocate_array needs a 'cpu' arena; device memory is not addressable from numpy");
  }
  // numpy needs a real address even for an empty array: a zero-byte request takes one byte.
  const std::size_t request = bytes == 0 ? 1 : bytes;
  void* ptr = self.stack->resource().allocate(request);
  auto* owner = new BlockOwner{self.stack, ptr, request};
  nb::capsule capsule(owner, [](void* p) noexcept {
    auto* block = static_cast<BlockOwner*>(p);
    block->stack->resource().deallocate(block->ptr, block->bytes);
    delete block;
  });
  return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<1>>(ptr, {bytes}, capsule);
}

nb::dict statistics_dict(const PyArena& self) {
  const latte::memory::Statistics s = self.stack->statistics().statistics();
  nb::dict d;
  d["capacity"] = s.capacity;
  d["reserved"] = s.reserved;
  d["live"] = s.live;
  d["allocated"] = s.allocated;
  d["free"] = s.free;
  d["largest_free_block"] = s.largest_free;
  d["peak_reserved"] = s.peak_reserved;
  d["peak_live"] = s.peak_live;
  d["peak_allocated"] = s.peak_allocated;
  d["internal_fragmentation"] = s.internal_fragmentation;
  d["external_fragmentation"] = s.external_fragmentation;
  d["allocations"] = s.allocations;
  d["frees"] = s.frees;
  d["failures"] = s.failures;
  d["pinned"] = self.stack->pinned();
  return d;
}

void bind_memory(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const latte::memory::bad_alloc& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    } catch (const latte::memory::logic_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  nb::class_<PyArena>(m, "BuddyArena", "A buddy-allocator arena over one pre-reserved region.")
      .def("__init__",
           [](PyArena* self, std::size_t capacity, const std::string& device, std::size_t min_block,
              std::optional<std::size_t> limit, bool size_classes, bool prefault) {
             new (self) PyArena(make_arena(capacity, device, min_block, limit, size_classes, prefault));
           },
           nb::arg("capacity"), nb::arg("device") = "cpu", nb::arg("min_block") = 256,
           nb::arg("limit") = nb::none(), nb::arg("size_classes") = true, nb::arg("prefault") = true)
      .def("allocate_array", &allocate_array, nb::arg("nbytes"),
           "A uint8 numpy view of a new block; the block returns to the arena with the last reference.")
      .def("stats", &statistics_dict)
      .def("check_invariants", [](const PyArena& self) { self.stack->arena().check_invariants(); })
      .def("release_cached", [](PyArena& self) { self.stack->arena().release_cached(); })
      .def_prop_ro("capacity", [](const PyArena& self) { return self.stack->arena().capacity(); })
      .def_prop_ro("min_block", [](const PyArena& self) { return self.stack->arena().options().min_block; })
      .def_prop_ro("device", [](const PyArena& self) {
        return self.stack->options().device == latte::memory::Device::cpu
                   ? std::string("cpu")
                   : "cuda:" + std::to_string(self.stack->options().device_id);
      });

  m.def("cuda_device_memory_compiled", &latte::memory::cuda_device_memory_compiled);
  m.def("cuda_runtime_available", &latte::memory::HostResource::cuda_runtime_available);
}

}  // namespace
// --- end memory ---

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
  bind_memory(m);

  // --- scheduling (AffinityScheduler) ---
}
