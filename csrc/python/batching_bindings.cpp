// latte._native's batching functions: the checks and packing of latte/batching/gather.hpp
// over numpy arrays, one call per execute and input instead of one per request.
#include <cstring>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include "numpy_api.hpp"

#include "bindings.hpp"
#include "latte/batching/gather.hpp"
#include "latte/batching/partition.hpp"
#include "latte/error.hpp"

namespace nb = nanobind;
namespace batching = latte::batching;

namespace {

batching::InputRule make_rule(int type, int float_bits, const std::vector<std::int64_t>& dims, bool batched,
                              std::int64_t max_rows, std::int64_t max_length, bool reject_nonfinite, int int_bits,
                              bool int_signed, std::int64_t low, std::int64_t high) {
  LATTE_EXPECTS(int_bits == 0 || int_bits == 8 || int_bits == 16 || int_bits == 32 || int_bits == 64,
                "InputRule: int_bits must be 0, 8, 16, 32 or 64");
  LATTE_EXPECTS(int_bits == 0 || low <= high, "InputRule: the valid range needs low <= high");
  LATTE_EXPECTS(dims.size() + 1 <= static_cast<std::size_t>(batching::kMaxRank),
                "InputRule: at most 7 dims besides the batch dimension");
  batching::InputRule rule;
  rule.type = type;
  rule.float_kind = float_bits == 16   ? batching::FloatKind::f16
                    : float_bits == 32 ? batching::FloatKind::f32
                    : float_bits == 64 ? batching::FloatKind::f64
                                       : batching::FloatKind::none;
  rule.ndim = static_cast<int>(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) rule.dims[i] = dims[i];
  rule.batched = batched;
  rule.max_rows = max_rows;
  rule.max_length = max_length;
  rule.reject_nonfinite = reject_nonfinite;
  rule.int_bits = int_bits;
  rule.int_signed = int_signed;
  rule.low = low;
  rule.high = high;
  return rule;
}

// A C-contiguous, aligned, native-order view of `obj`; `keep` holds any copy made for it.
// `type` is reported as `want` when numpy calls the two types equivalent (int64 is both
// 'l' and 'q' on Linux), so the core compares plain numbers.
batching::ArrayView view_of(nb::handle obj, int want, std::vector<nb::object>& keep) {
  PyObject* ptr = obj.ptr();
  constexpr int kFlags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
  if (!PyArray_Check(ptr) || !PyArray_CHKFLAGS(reinterpret_cast<PyArrayObject*>(ptr), kFlags) ||
      !PyArray_ISNOTSWAPPED(reinterpret_cast<PyArrayObject*>(ptr))) {
    PyArray_Descr* descr = nullptr;
    if (PyArray_Check(ptr)) {
      descr = PyArray_DescrNewByteorder(PyArray_DESCR(reinterpret_cast<PyArrayObject*>(ptr)), NPY_NATIVE);
      if (descr == nullptr) throw nb::python_error();
    }
    PyObject* copy = PyArray_FromAny(ptr, descr, 0, 0, kFlags, nullptr);  // steals descr
    if (copy == nullptr) throw nb::python_error();
    keep.push_back(nb::steal(copy));
    ptr = copy;
  }
  auto* array = reinterpret_cast<PyArrayObject*>(ptr);
  batching::ArrayView v;
  v.ndim = PyArray_NDIM(array);
  LATTE_EXPECTS(v.ndim <= batching::kMaxRank, "arrays may have at most 8 dimensions");
  v.data = static_cast<const std::byte*>(PyArray_DATA(array));
  v.itemsize = static_cast<int>(PyArray_ITEMSIZE(array));
  v.type = PyArray_TYPE(array);
  if (v.type != want && want >= 0 && PyArray_EquivTypenums(v.type, want)) v.type = want;
  for (int i = 0; i < v.ndim; ++i) v.shape[i] = PyArray_DIM(array, i);
  return v;
}

// (rows per array, longest -1 dimension per array (-1: none), [(index, problem, detail)]).
nb::tuple inspect_arrays(const batching::InputRule& rule, nb::sequence arrays) {
  const std::size_t n = nb::len(arrays);
  std::vector<nb::object> keep;
  std::vector<batching::ArrayView> views;
  views.reserve(n);
  for (std::size_t i = 0; i < n; ++i) views.push_back(view_of(arrays[i], rule.type, keep));
  std::vector<batching::Finding> found(n);
  {
    // The non-finite check reads every value; the rest is cheap either way.
    nb::gil_scoped_release release;
    for (std::size_t i = 0; i < n; ++i) found[i] = batching::inspect(views[i], rule);
  }
  nb::list rows, lengths, problems;
  for (std::size_t i = 0; i < n; ++i) {
    rows.append(found[i].rows);
    lengths.append(found[i].length);
    if (found[i].problem != batching::Problem::none) {
      problems.append(nb::make_tuple(i, static_cast<int>(found[i].problem), found[i].detail));
    }
  }
  return nb::make_tuple(rows, lengths, problems);
}

void pack_arrays(nb::sequence arrays, nb::handle out, nb::bytes pad) {
  PyObject* optr = out.ptr();
  LATTE_EXPECTS(PyArray_Check(optr), "pack_arrays: out must be a numpy array");
  auto* oarr = reinterpret_cast<PyArrayObject*>(optr);
  LATTE_EXPECTS(PyArray_CHKFLAGS(oarr, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_WRITEABLE | NPY_ARRAY_ALIGNED),
                "pack_arrays: out must be a writable C-contiguous array");
  // A byte copy of object pointers would neither count their references nor keep them alive.
  LATTE_EXPECTS(!PyDataType_REFCHK(PyArray_DESCR(oarr)),
                "pack_arrays: arrays of Python objects hold references; concatenate them instead");
  const int itemsize = static_cast<int>(PyArray_ITEMSIZE(oarr));
  LATTE_EXPECTS(pad.size() == static_cast<std::size_t>(itemsize), "pack_arrays: pad must be one element of out's type");
  const int ndim = PyArray_NDIM(oarr);
  LATTE_EXPECTS(ndim >= 1 && ndim <= batching::kMaxRank, "pack_arrays: out must have 1 to 8 dimensions");
  std::int64_t shape[batching::kMaxRank];
  for (int i = 0; i < ndim; ++i) shape[i] = PyArray_DIM(oarr, i);
  const int type = PyArray_TYPE(oarr);
  const std::size_t n = nb::len(arrays);
  std::vector<nb::object> keep;
  std::vector<batching::ArrayView> views;
  views.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    views.push_back(view_of(arrays[i], type, keep));
    LATTE_EXPECTS(views.back().type == type, "pack_arrays: a part's data type differs from out's");
  }
  std::byte* data = static_cast<std::byte*>(PyArray_DATA(oarr));
  std::byte pad_bytes[16];
  std::memcpy(pad_bytes, pad.c_str(), pad.size());
  nb::gil_scoped_release release;
  batching::pack(views.data(), views.size(), data, shape, ndim, itemsize, pad_bytes);
}

// Each row's reach along dimension 1 of a padded array (int64, one per row).
nb::object row_lengths(nb::handle array, nb::bytes pad) {
  LATTE_EXPECTS(PyArray_Check(array.ptr()), "row_lengths: needs a numpy array");
  LATTE_EXPECTS(!PyDataType_REFCHK(PyArray_DESCR(reinterpret_cast<PyArrayObject*>(array.ptr()))),
                "row_lengths: arrays of Python objects have no padding to measure");
  std::vector<nb::object> keep;
  batching::ArrayView view = view_of(array, -1, keep);
  LATTE_EXPECTS(view.ndim >= 2, "row_lengths: the array needs rows and a dimension to measure");
  LATTE_EXPECTS(pad.size() == static_cast<std::size_t>(view.itemsize), "row_lengths: pad must be one element");
  npy_intp rows = static_cast<npy_intp>(view.shape[0]);
  PyObject* out = PyArray_SimpleNew(1, &rows, NPY_INT64);
  if (out == nullptr) throw nb::python_error();
  nb::object result = nb::steal(out);
  std::byte pad_bytes[16];
  std::memcpy(pad_bytes, pad.c_str(), pad.size());
  auto* lengths = static_cast<std::int64_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(out)));
  {
    nb::gil_scoped_release release;
    batching::row_lengths(view, pad_bytes, lengths);
  }
  return result;
}

}  // namespace

void bind_batching(nb::module_& m) {
  nb::class_<batching::InputRule>(m, "InputRule", "What one input's arrays must look like.")
      .def("__init__",
           [](batching::InputRule* self, int type, int float_bits, const std::vector<std::int64_t>& dims, bool batched,
              std::int64_t max_rows, std::int64_t max_length, bool reject_nonfinite, int int_bits, bool int_signed,
              std::int64_t low, std::int64_t high) {
             new (self) batching::InputRule(make_rule(type, float_bits, dims, batched, max_rows, max_length,
                                                      reject_nonfinite, int_bits, int_signed, low, high));
           },
           nb::arg("type"), nb::arg("float_bits"), nb::arg("dims"), nb::arg("batched"), nb::arg("max_rows"),
           nb::arg("max_length"), nb::arg("reject_nonfinite"), nb::arg("int_bits") = 0, nb::arg("int_signed") = true,
           nb::arg("low") = 0, nb::arg("high") = 0);
  m.def("inspect_arrays", &inspect_arrays, nb::arg("rule"), nb::arg("arrays"),
        "Check each array against the rule: (rows, lengths, [(index, problem, detail)]).");
  m.def("pack_arrays", &pack_arrays, nb::arg("arrays"), nb::arg("out"), nb::arg("pad"),
        "Copy the arrays row after row into out, padding what they do not cover with pad.");
  m.def("row_lengths", &row_lengths, nb::arg("array"), nb::arg("pad"),
        "How far each row reaches along dimension 1 before only padding follows (at least 1).");
  m.def("partition_runs", &batching::partition, nb::arg("pad_row_cost"), nb::arg("alone_cost"), nb::arg("rows"),
        nb::arg("fixed"), nb::arg("max_rows"),
        "The cheapest cut of length-sorted requests into runs of at most max_rows rows: [(start, end)].");
  nb::list problems;
  for (const char* name : {"none", "dtype", "shape", "rows", "too_long", "empty", "nonfinite", "out_of_range"}) problems.append(name);
  m.attr("BATCH_PROBLEMS") = nb::tuple(problems);
}
