// The one file that exposes the C++ core to Python as latte._native.
#include <cmath>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "latte/build_info.hpp"
#include "latte/scheduling/affinity_scheduler.hpp"
// --- memory (BuddyArena) ---
// Arena arrays are built with the NumPy C API: a numpy.empty-like call must cost about what
// numpy.empty costs, which a DLPack/buffer round trip does not.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
// Shared with batching_bindings.cpp, which uses the table imported here.
#define PY_ARRAY_UNIQUE_SYMBOL latte_native_ARRAY_API
#include <numpy/arrayobject.h>
// --- end memory ---
#include "latte/memory/arena_stack.hpp"
#include "latte/memory/error.hpp"
#include "latte/memory/host_resource.hpp"

namespace nb = nanobind;

void bind_batching(nb::module_& m);  // batching_bindings.cpp

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

// numpy.empty(shape, dtype) whose memory is an arena block; the block goes back to the arena
// when numpy releases the array's base, a capsule owning the block.
nb::object empty_array(PyArena& self, nb::handle shape, nb::handle dtype) {
  if (self.stack->options().device != latte::memory::Device::cpu) {
    throw latte::memory::logic_error("empty() needs a 'cpu' arena; device memory is not addressable from numpy");
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
  std::size_t bytes = static_cast<std::size_t>(descr->elsize);
  bool negative = false, overflow = false;
  for (int i = 0; i < dims.len; ++i) {
    if (dims.ptr[i] < 0) negative = true;
    else if (__builtin_mul_overflow(bytes, static_cast<std::size_t>(dims.ptr[i]), &bytes)) overflow = true;
  }
  std::vector<npy_intp> dim_values(dims.ptr, dims.ptr + dims.len);
  PyDimMem_FREE(dims.ptr);
  if (negative) throw nb::value_error("shape must not have negative dimensions");
  if (overflow) throw latte::memory::out_of_memory("BuddyArena: requested shape overflows the address space");
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
  if (_import_array() < 0) throw nb::python_error();
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
      .def("empty", &empty_array, nb::arg("shape"), nb::arg("dtype") = nb::none(),
           "numpy.empty over a new block; the block returns to the arena with the last reference.")
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

// --- scheduling (AffinityScheduler) ---
namespace {
namespace sched = latte::scheduling;

std::string reason_text(const sched::Outcome& o) {
  std::string text = sched::reason_name(o.reason);
  if (!o.detail.empty()) text += ": " + o.detail;
  return text;
}

// Lanes are native threads; each takes the GIL only around a call into Python.
class PyAffinityScheduler {
 public:
  PyAffinityScheduler(nb::callable execute, nb::callable on_complete, nb::object prefetch,
                      std::vector<std::vector<int>> lane_cpus, std::size_t max_batch_size,
                      std::uint64_t max_batch_bytes, std::size_t queue_capacity,
                      double max_window_s, double target_utilization,
                      std::size_t placement_slack, std::size_t steal_min_queued)
      : execute_(std::move(execute)), complete_(std::move(on_complete)),
        prefetch_(std::move(prefetch)) {
    if (!(max_window_s >= 0.0)) throw std::invalid_argument("max_window_s must be >= 0 seconds");
    if (!prefetch_.is_none() && !PyCallable_Check(prefetch_.ptr())) {
      throw nb::type_error("prefetch must be callable or None");
    }
    sched::SchedulerConfig config;
    config.max_batch_size = max_batch_size;
    config.max_batch_bytes = max_batch_bytes;
    config.queue_capacity = queue_capacity;
    config.max_window = static_cast<sched::Nanos>(max_window_s * 1e9);
    config.target_utilization = target_utilization;
    config.placement_slack = placement_slack;
    config.steal_min_queued = steal_min_queued;
    sched::PrefetchFn prefetch_fn;
    if (!prefetch_.is_none()) prefetch_fn = [this](const sched::Batch& b) { call(prefetch_, b); };
    nb::gil_scoped_release release;  // lanes start without needing the GIL, but do not block them
    impl_ = std::make_unique<sched::AffinityScheduler>(
        config, std::move(lane_cpus), [this](const sched::Batch& b) { call(execute_, b); },
        [this](const std::vector<sched::Outcome>& outcomes) { report(outcomes); },
        std::move(prefetch_fn));
  }

  ~PyAffinityScheduler() {
    nb::gil_scoped_release release;
    impl_.reset();
  }

  std::optional<std::string> submit(std::uint64_t id, std::string key, int priority,
                                    std::optional<double> timeout_s, std::uint64_t size) {
    if (closed_) throw std::runtime_error("AffinityScheduler is closed; submit() needs an open one");
    if (timeout_s && std::isnan(*timeout_s)) throw std::invalid_argument("timeout_s must not be NaN");
    sched::Request r;
    r.id = id;
    r.affinity_key = std::move(key);
    r.priority = priority;
    r.size = size;
    nb::gil_scoped_release release;
    const sched::Nanos now = impl_->now();
    if (timeout_s) {
      const double deadline = static_cast<double>(now) + *timeout_s * 1e9;
      r.deadline = deadline >= static_cast<double>(sched::kNoDeadline)
                       ? sched::kNoDeadline
                       : static_cast<sched::Nanos>(deadline);
    }
    std::optional<sched::RejectReason> refusal = impl_->submit(r);
    if (!refusal) return std::nullopt;
    return std::string(sched::reason_name(*refusal));
  }

  void close(bool drain) {
    {
      nb::gil_scoped_release release;
      impl_->shutdown(drain);
    }
    closed_ = true;
    // Drop the callables: they often refer back to this object, and nothing calls them now.
    execute_ = nb::none();
    complete_ = nb::none();
    prefetch_ = nb::none();
  }

  bool closed() const { return closed_; }
  double now() const { return static_cast<double>(impl_->now()) * 1e-9; }
  std::size_t lanes() const { return impl_->lanes(); }

  nb::list pinning() const {
    nb::list out;
    for (const sched::PinningResult& p : impl_->pinning()) {
      out.append(nb::make_tuple(p.pinned, p.message));
    }
    return out;
  }

  nb::dict metrics() const {
    sched::MetricsSnapshot m;
    {
      nb::gil_scoped_release release;
      m = impl_->metrics();
    }
    nb::dict d;
    nb::dict depth, histogram, rejections, latency;
    for (int p = 0; p < sched::kPriorityLevels; ++p) depth[nb::int_(p)] = m.queue_depth[p];
    for (std::size_t n = 1; n < m.batch_size_histogram.size(); ++n) {
      if (m.batch_size_histogram[n] > 0) histogram[nb::int_(n)] = m.batch_size_histogram[n];
    }
    for (const auto& [reason, count] : m.rejections) rejections[nb::str(reason.c_str())] = count;
    for (int p = 0; p < sched::kPriorityLevels; ++p) {
      const sched::LatencyPercentiles& l = m.latency[p];
      if (l.count == 0) continue;
      nb::dict one;
      one["count"] = l.count;
      one["p50"] = l.p50;
      one["p90"] = l.p90;
      one["p99"] = l.p99;
      one["p999"] = l.p999;
      latency[nb::int_(p)] = one;
    }
    d["queue_depth"] = depth;
    d["batch_size_histogram"] = histogram;
    d["batches"] = m.batches;
    d["batches_flushed_by_timeout"] = m.batches_flushed_by_timeout;
    d["timeout_flush_share"] =
        m.batches ? static_cast<double>(m.batches_flushed_by_timeout) / m.batches : 0.0;
    d["steals"] = m.steals;
    d["affinity_hits"] = m.affinity_hits;
    d["affinity_hit_rate"] =
        m.affinity_eligible ? static_cast<double>(m.affinity_hits) / m.affinity_eligible : 0.0;
    d["completed"] = m.completed;
    d["rejections"] = rejections;
    d["latency_s"] = latency;
    return d;
  }

 private:
  // Runs on a lane thread without the GIL.
  void call(const nb::object& fn, const sched::Batch& batch) {
    nb::gil_scoped_acquire gil;
    nb::list ids;
    for (const sched::QueuedRequest& q : batch.requests) ids.append(q.request.id);
    try {
      fn(batch.affinity_key, ids, batch.lane);
    } catch (nb::python_error& e) {
      // The model's exception becomes the requests' error reason.
      std::string message = nb::borrow<nb::str>(nb::handle(e.type()).attr("__name__")).c_str();
      message += ": ";
      message += nb::str(e.value()).c_str();
      throw std::runtime_error(message);
    }
  }

  void report(const std::vector<sched::Outcome>& outcomes) {
    nb::gil_scoped_acquire gil;
    if (complete_.is_none()) return;
    for (const sched::Outcome& o : outcomes) {
      try {
        if (o.ok) {
          complete_(o.id, nb::none());
        } else {
          complete_(o.id, reason_text(o));
        }
      } catch (nb::python_error& e) {
        // One failing delivery must not keep the others of the batch from being reported.
        e.discard_as_unraisable("latte.scheduling on_complete callback");
      }
    }
  }

  nb::object execute_, complete_, prefetch_;
  std::unique_ptr<sched::AffinityScheduler> impl_;
  bool closed_ = false;
};

}  // namespace
// --- end scheduling ---

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

  // --- batching (request checks and packing) ---
  bind_batching(m);

  // --- scheduling (AffinityScheduler) ---
  nb::class_<PyAffinityScheduler>(m, "AffinityScheduler", nb::is_weak_referenceable(),
                                  "Native locality-aware scheduler; use latte.scheduling.")
      .def(nb::init<nb::callable, nb::callable, nb::object, std::vector<std::vector<int>>,
                    std::size_t, std::uint64_t, std::size_t, double, double, std::size_t,
                    std::size_t>(),
           nb::arg("execute"), nb::arg("on_complete"), nb::arg("prefetch").none(),
           nb::arg("lane_cpus"), nb::arg("max_batch_size"), nb::arg("max_batch_bytes"),
           nb::arg("queue_capacity"), nb::arg("max_window_s"), nb::arg("target_utilization"),
           nb::arg("placement_slack"), nb::arg("steal_min_queued"))
      .def("submit", &PyAffinityScheduler::submit, nb::arg("request_id"), nb::arg("key"),
           nb::kw_only(), nb::arg("priority") = 0, nb::arg("timeout_s").none() = nb::none(),
           nb::arg("size") = 1,
           "Queue a request; returns None when admitted, else the rejection reason (which "
           "on_complete also receives, as the one answer for the request).")
      .def("close", &PyAffinityScheduler::close, nb::arg("drain") = true,
           "Stop the lanes; drain=True runs what is queued first, else it is rejected.")
      .def_prop_ro("closed", &PyAffinityScheduler::closed)
      .def_prop_ro("lanes", &PyAffinityScheduler::lanes)
      .def("now", &PyAffinityScheduler::now, "The scheduler's clock, in seconds.")
      .def("pinning", &PyAffinityScheduler::pinning,
           "Per lane: (pinned, reason it is not) after start-up.")
      .def("metrics", &PyAffinityScheduler::metrics, "Counters and latency percentiles.");
  nb::list reasons;
  for (auto r : {sched::RejectReason::kQueueFull, sched::RejectReason::kDeadlinePassed,
                 sched::RejectReason::kTooLarge, sched::RejectReason::kDeadlineExpired,
                 sched::RejectReason::kDisplaced, sched::RejectReason::kShutdown,
                 sched::RejectReason::kExecuteFailed}) {
    reasons.append(sched::reason_name(r));
  }
  m.attr("REJECT_REASONS") = nb::tuple(reasons);
  m.attr("PRIORITY_LEVELS") = sched::kPriorityLevels;
  // --- end scheduling ---
}
