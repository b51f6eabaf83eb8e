#pragma once
// Per-call batch work that would otherwise be per-request Python: checking each request's
// input array against the config, and packing the arrays of one planned batch (ragged
// ones padded) into one buffer. Plain C++ over raw views, so it runs with the GIL released
// and is tested without Python.
#include <cstddef>
#include <cstdint>

namespace latte::batching {

// Deeper tensors are refused by the config check before they reach here.
constexpr int kMaxRank = 8;

// One request's array: C-contiguous, native byte order.
struct ArrayView {
  const std::byte* data = nullptr;
  int type = -1;  // the caller's type code (numpy's type number); compared for equality only
  int itemsize = 0;
  int ndim = 0;
  std::int64_t shape[kMaxRank] = {};
};

// Floating-point layouts whose non-finite values can be refused.
enum class FloatKind : std::uint8_t { none, f16, f32, f64 };

// What one input's arrays must look like (the config's data_type and dims).
struct InputRule {
  int type = -1;
  FloatKind float_kind = FloatKind::none;
  int ndim = 0;                       // dims without the batch dimension
  std::int64_t dims[kMaxRank] = {};   // -1 = any size
  bool batched = true;                // arrays carry a leading batch dimension
  std::int64_t max_rows = 0;          // batched: 1..max_rows rows per request
  std::int64_t max_length = 0;        // limit on the -1 dims; 0 = none
  bool reject_nonfinite = false;
  // Integer inputs with a declared valid range (token ids into an embedding, say): the
  // element layout, and the inclusive bounds every value must lie within.
  int int_bits = 0;                   // 8, 16, 32 or 64; 0 = no range check
  bool int_signed = true;
  std::int64_t low = 0;
  std::int64_t high = 0;
};

// Why an array was refused; the caller words the message (it knows names and types).
enum class Problem : std::uint8_t { none = 0, dtype, shape, rows, too_long, empty, nonfinite, out_of_range };

struct Finding {
  std::int64_t rows = 0;      // batch rows the request contributes (1 when unbatched)
  std::int64_t length = -1;   // its longest -1 dimension; -1 when the input has none
  Problem problem = Problem::none;
  std::int64_t detail = 0;    // too_long: the length; nonfinite, out_of_range: the flat index of the value
};

// The checks of one array, in the order the messages are reported: data type, shape, rows,
// length limit, empty dimensions, non-finite values, values outside the valid range.
Finding inspect(const ArrayView& array, const InputRule& rule) noexcept;

// Copies `count` arrays one after another along the batch dimension into `out`, a
// C-contiguous buffer of shape out_shape[0..ndim) whose first dimension is the total rows.
// Where a part is shorter than out_shape in some dimension, the rest of its rows hold the
// `itemsize` bytes at `pad`. Every part must have ndim dimensions, none larger than out's.
void pack(const ArrayView* parts, std::size_t count, std::byte* out, const std::int64_t* out_shape, int ndim,
          int itemsize, const std::byte* pad);

// How far each row of a padded batch really reaches along its dimension 1 (the rows of
// token ids a pre-processing step returns, padded to the longest): one past the last position
// whose elements are not all the `itemsize` bytes at `pad`, at least 1. `lengths` takes
// array.shape[0] values; the array has at least 2 dimensions.
void row_lengths(const ArrayView& array, const std::byte* pad, std::int64_t* lengths) noexcept;

}  // namespace latte::batching
