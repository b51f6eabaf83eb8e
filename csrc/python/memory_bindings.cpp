// latte._native's memory part: BuddyArena, whose arrays are numpy arrays over arena blocks.
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

// Arena arrays are built with the NumPy C API: a numpy.empty-like call must cost about what
// numpy.empty costs, which a DLPack/buffer round trip does not.
#include "numpy_api.hpp"

#include "bindings.hpp"
#include "latte/error.hpp"
#include "latte/memory/arena_stack.hpp"
#include "latte/memory/device_pages.hpp"
#include "latte/memory/host_resource.hpp"

namespace nb = nanobind;

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
                   std::optional<std::size_t> limit, bool size_classes, bool prefault, bool paged,
                   std::size_t page_bytes, std::optional<unsigned> idle_share) {
  latte::memory::ArenaStackOptions options;
  options.capacity = capacity;
  if (device == "cpu") {
    options.device = latte::memory::Device::cpu;
  } else if (device.rfind("cuda", 0) == 0) {
    options.device = latte::memory::Device::cuda;
    options.device_id = device.size() > 5 ? std::stoi(device.substr(5)) : 0;
  } else {
    throw latte::logic_error("device must be 'cpu' or 'cuda[:N]', got '" + device + "'");
  }
  options.arena.min_block = min_block;
  options.arena.size_classes = size_classes;
  options.limit = limit.value_or(0);
  options.prefault = prefault;
  options.paged = paged;
  options.page_bytes = page_bytes;
  if (idle_share) options.idle_share = static_cast<int>(*idle_share);
  return PyArena{std::make_shared<ArenaStack>(options)};
}

// numpy.empty(shape, dtype) whose memory is an arena block; the block goes back to the arena
// when numpy releases the array's base, a capsule owning the block.
nb::object empty_array(PyArena& self, nb::handle shape, nb::handle dtype) {
  if (self.stack->options().device != latte::memory::Device::cpu) {
    throw latte::logic_error("empty() needs a 'cpu' arena; device memory is not addressable from numpy");
  }
  // Converting a scalar type (np.float32) to a descriptor is slow; cache it per type.
  static nb::dict* descr_cache = new nb::dict();  // leaked: lives as long as the interpreter
  PyArray_Descr* descr = nullptr;
  nb::object descr_ref;
  if (dtype.is_none()) {
    descr_ref = nb::steal(reinterpret_cast<PyObject*>(PyArray_DescrFromType(NPY_FLOAT32)));
  } else if (PyArray_DescrCheck(dtype.ptr())) {
    descr_ref = nb::borrow(dtype);
  } else if (PyObject* cached = PyDict_GetItem(descr_cache->ptr(), dtype.ptr())) {
    descr_ref = nb::borrow(cached);
  } else {
    if (!PyArray_DescrConverter(dtype.ptr(), &descr)) throw nb::python_error();
    descr_ref = nb::steal(reinterpret_cast<PyObject*>(descr));
    if (PyType_Check(dtype.ptr())) (*descr_cache)[dtype] = descr_ref;
  }
  descr = reinterpret_cast<PyArray_Descr*>(descr_ref.ptr());
  if (PyDataType_REFCHK(descr)) {
    throw nb::type_error("dtype holds Python objects; arena arrays need plain data");
  }
  PyArray_Dims dims{nullptr, 0};
  if (!PyArray_IntpConverter(shape.ptr(), &dims)) {
    PyErr_Clear();
    throw nb::type_error(("shape must be an int or a sequence of ints, got " +
                          std::string(nb::str(nb::repr(shape)).c_str())).c_str());
  }
  std::size_t bytes = static_cast<std::size_t>(PyDataType_ELSIZE(descr));
  bool negative = false, overflow = false;
  for (int i = 0; i < dims.len; ++i) {
    if (dims.ptr[i] < 0) negative = true;
    else if (__builtin_mul_overflow(bytes, static_cast<std::size_t>(dims.ptr[i]), &bytes)) overflow = true;
  }
  std::vector<npy_intp> dim_values(dims.ptr, dims.ptr + dims.len);
  PyDimMem_FREE(dims.ptr);
  if (negative) throw nb::value_error("shape must not have negative dimensions");
  if (overflow) throw latte::out_of_memory("BuddyArena: requested shape overflows the address space");
  // numpy needs a real address even for an empty array: a zero-byte request takes one byte.
  const std::size_t request = bytes == 0 ? 1 : bytes;
  void* ptr = self.stack->resource().allocate(request);
  BlockOwner* owner = nullptr;
  try {
    owner = new BlockOwner{self.stack, ptr, request};
  } catch (...) {
    self.stack->resource().deallocate(ptr, request);
    throw;
  }
  nb::capsule capsule(owner, [](void* p) noexcept {
    auto* block = static_cast<BlockOwner*>(p);
    block->stack->resource().deallocate(block->ptr, block->bytes);
    delete block;
  });
  Py_INCREF(descr);  // PyArray_NewFromDescr steals one reference
  PyObject* array = PyArray_NewFromDescr(&PyArray_Type, descr, static_cast<int>(dim_values.size()),
                                         dim_values.data(), nullptr, ptr, NPY_ARRAY_CARRAY, nullptr);
  if (array == nullptr) throw nb::python_error();
  nb::object result = nb::steal(array);
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(array), capsule.release().ptr()) < 0) {
    throw nb::python_error();
  }
  return result;
}

nb::dict statistics_dict(const PyArena& self) {
  const latte::memory::Statistics s = self.stack->statistics();
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
  d["p99_request"] = s.p99_request;
  d["fragmentation_failures"] = s.fragmentation_failures;
  d["fragmented"] = s.fragmented;
  d["pinned"] = self.stack->pinned();
  // Paged arenas: the pages behind the blocks (all 0 otherwise).
  d["paged"] = self.stack->arena().paged();
  d["page_bytes"] = s.page_bytes;
  d["address_range"] = s.address_range;
  d["mapped"] = s.mapped;
  d["physical_held"] = s.physical_held;
  d["map_calls"] = s.map_calls;
  d["unmap_calls"] = s.unmap_calls;
  d["mapped_total"] = s.mapped_total;
  d["warm"] = s.warm;
  return d;
}

}  // namespace

void bind_memory(nb::module_& m) {
  // A CUDA device's pages' own idle share (BuddyArena's idle_share=None there), for what
  // replays a device's allocations on the host; a build without CUDA has the same default.
  m.attr("DEVICE_IDLE_SHARE") = latte::memory::DevicePagesOptions{}.idle_share;

  nb::class_<PyArena>(m, "BuddyArena", "A buddy-allocator arena over one pre-reserved region.")
      .def("__init__",
           [](PyArena* self, std::size_t capacity, const std::string& device, std::size_t min_block,
              std::optional<std::size_t> limit, bool size_classes, bool prefault, bool paged,
              std::size_t page_bytes, std::optional<unsigned> idle_share) {
             new (self) PyArena(make_arena(capacity, device, min_block, limit, size_classes, prefault, paged,
                                           page_bytes, idle_share));
           },
           nb::arg("capacity"), nb::arg("device") = "cpu", nb::arg("min_block") = 256,
           nb::arg("limit") = nb::none(), nb::arg("size_classes") = true, nb::arg("prefault") = true,
           nb::arg("paged") = false, nb::arg("page_bytes") = std::size_t{1} << 20,
           nb::arg("idle_share") = nb::none())
      .def("empty", &empty_array, nb::arg("shape"), nb::arg("dtype") = nb::none(),
           "numpy.empty over a new block; the block returns to the arena with the last reference.")
      .def("stats", &statistics_dict)
      .def("check_invariants", [](const PyArena& self) { self.stack->arena().check_invariants(); })
      .def("release_cached", [](PyArena& self) { self.stack->arena().release_cached(); })
      .def_prop_ro("capacity", [](const PyArena& self) { return self.stack->arena().capacity(); })
      .def_prop_ro("page_kind", [](const PyArena& self) { return std::string(self.stack->arena().page_kind()); })
      .def_prop_ro("fallback_reason", [](const PyArena& self) { return self.stack->fallback_reason(); })
      .def_prop_ro("min_block", [](const PyArena& self) { return self.stack->arena().options().min_block; })
      .def_prop_ro("device", [](const PyArena& self) {
        return self.stack->options().device == latte::memory::Device::cpu
                   ? std::string("cpu")
                   : "cuda:" + std::to_string(self.stack->options().device_id);
      });

  m.def("cuda_device_memory_compiled", &latte::memory::cuda_device_memory_compiled);
  m.def("cuda_runtime_available", &latte::memory::HostResource::cuda_runtime_available);
}
