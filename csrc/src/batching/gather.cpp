#include "latte/batching/gather.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "latte/error.hpp"

namespace latte::batching {
namespace {

std::int64_t elements(const ArrayView& a) noexcept {
  std::int64_t n = 1;
  for (int i = 0; i < a.ndim; ++i) n *= a.shape[i];
  return n;
}

// Flat index of the first NaN or infinity, or -1.
std::int64_t first_nonfinite(const ArrayView& a, FloatKind kind) noexcept {
  const std::int64_t n = elements(a);
  switch (kind) {
    case FloatKind::f16: {
      // Exponent bits all set: infinity or NaN, whatever the mantissa.
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, a.data + 2 * i, 2);
        if ((bits & 0x7C00u) == 0x7C00u) return i;
      }
      return -1;
    }
    case FloatKind::f32: {
      const float* p = reinterpret_cast<const float*>(a.data);
      for (std::int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(p[i])) return i;
      }
      return -1;
    }
    case FloatKind::f64: {
      const double* p = reinterpret_cast<const double*>(a.data);
      for (std::int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(p[i])) return i;
      }
      return -1;
    }
    case FloatKind::none:
      return -1;
  }
  return -1;
}

template <typename T>
std::int64_t first_outside(const std::byte* data, std::int64_t n, std::int64_t low, std::int64_t high) noexcept {
  const T* p = reinterpret_cast<const T*>(data);
  for (std::int64_t i = 0; i < n; ++i) {
    // Compared as 64-bit values; an unsigned value past INT64_MAX is outside any int64 range.
    if constexpr (std::is_unsigned_v<T> && sizeof(T) == 8) {
      if (p[i] > static_cast<std::uint64_t>(INT64_MAX)) return i;
    }
    const auto v = static_cast<std::int64_t>(p[i]);
    if (v < low || v > high) return i;
  }
  return -1;
}

// Flat index of the first value outside [rule.low, rule.high], or -1.
std::int64_t first_out_of_range(const ArrayView& a, const InputRule& rule) noexcept {
  const std::int64_t n = elements(a);
  switch (rule.int_bits) {
    case 8:
      return rule.int_signed ? first_outside<std::int8_t>(a.data, n, rule.low, rule.high)
                             : first_outside<std::uint8_t>(a.data, n, rule.low, rule.high);
    case 16:
      return rule.int_signed ? first_outside<std::int16_t>(a.data, n, rule.low, rule.high)
                             : first_outside<std::uint16_t>(a.data, n, rule.low, rule.high);
    case 32:
      return rule.int_signed ? first_outside<std::int32_t>(a.data, n, rule.low, rule.high)
                             : first_outside<std::uint32_t>(a.data, n, rule.low, rule.high);
    case 64:
      return rule.int_signed ? first_outside<std::int64_t>(a.data, n, rule.low, rule.high)
                             : first_outside<std::uint64_t>(a.data, n, rule.low, rule.high);
    default:
      return -1;
  }
}

void fill(std::byte* out, std::int64_t elements, int itemsize, const std::byte* pad) noexcept {
  bool uniform = true;
  for (int i = 1; i < itemsize; ++i) uniform = uniform && pad[i] == pad[0];
  if (uniform) {
    std::memset(out, static_cast<int>(pad[0]), static_cast<std::size_t>(elements) * itemsize);
    return;
  }
  for (std::int64_t i = 0; i < elements; ++i) std::memcpy(out + i * itemsize, pad, itemsize);
}

// Copies the block of `shape` (C-contiguous, strides src_strides) into the larger block
// whose strides are dst_strides, from dimension `dim` on.
void copy_block(const std::byte* src, const std::int64_t* shape, const std::int64_t* src_strides, std::byte* dst,
                const std::int64_t* dst_strides, int dim, int ndim, int itemsize) noexcept {
  if (dim == ndim - 1) {
    std::memcpy(dst, src, static_cast<std::size_t>(shape[dim]) * itemsize);
    return;
  }
  for (std::int64_t i = 0; i < shape[dim]; ++i) {
    copy_block(src + i * src_strides[dim], shape, src_strides, dst + i * dst_strides[dim], dst_strides, dim + 1, ndim,
               itemsize);
  }
}

}  // namespace

Finding inspect(const ArrayView& array, const InputRule& rule) noexcept {
  Finding found;
  if (array.type != rule.type) {
    found.problem = Problem::dtype;
    return found;
  }
  const int lead = rule.batched ? 1 : 0;
  if (array.ndim != rule.ndim + lead) {
    found.problem = Problem::shape;
    return found;
  }
  for (int i = 0; i < rule.ndim; ++i) {
    if (rule.dims[i] != -1 && rule.dims[i] != array.shape[lead + i]) {
      found.problem = Problem::shape;
      return found;
    }
  }
  found.rows = rule.batched ? array.shape[0] : 1;
  if (rule.batched && (found.rows < 1 || found.rows > rule.max_rows)) {
    found.problem = Problem::rows;
    found.detail = found.rows;
    return found;
  }
  bool empty = false;
  for (int i = 0; i < rule.ndim; ++i) {
    const std::int64_t size = array.shape[lead + i];
    empty = empty || size == 0;
    if (rule.dims[i] != -1) continue;
    if (rule.max_length > 0 && size > rule.max_length) {
      found.problem = Problem::too_long;
      found.detail = size;
      return found;
    }
    if (size > found.length) found.length = size;
  }
  if (empty) {
    found.problem = Problem::empty;
    return found;
  }
  if (rule.reject_nonfinite) {
    const std::int64_t at = first_nonfinite(array, rule.float_kind);
    if (at >= 0) {
      found.problem = Problem::nonfinite;
      found.detail = at;
      return found;
    }
  }
  if (rule.int_bits != 0) {
    const std::int64_t at = first_out_of_range(array, rule);
    if (at >= 0) {
      found.problem = Problem::out_of_range;
      found.detail = at;
    }
  }
  return found;
}

void pack(const ArrayView* parts, std::size_t count, std::byte* out, const std::int64_t* out_shape, int ndim,
          int itemsize, const std::byte* pad) {
  LATTE_EXPECTS(ndim >= 1 && ndim <= kMaxRank, "pack: out must have 1 to 8 dimensions");
  std::int64_t out_strides[kMaxRank];
  out_strides[ndim - 1] = itemsize;
  for (int d = ndim - 2; d >= 0; --d) out_strides[d] = out_strides[d + 1] * out_shape[d + 1];
  std::int64_t at = 0;  // rows written so far
  for (std::size_t p = 0; p < count; ++p) {
    const ArrayView& part = parts[p];
    LATTE_EXPECTS(part.ndim == ndim && part.itemsize == itemsize, "pack: a part's rank or item size differs from out's");
    LATTE_EXPECTS(at + part.shape[0] <= out_shape[0], "pack: the parts have more rows than out");
    bool same = true;
    for (int d = 1; d < ndim; ++d) {
      LATTE_EXPECTS(part.shape[d] <= out_shape[d], "pack: a part is larger than out in a dimension");
      same = same && part.shape[d] == out_shape[d];
    }
    std::byte* dst = out + at * out_strides[0];
    if (same) {
      std::memcpy(dst, part.data, static_cast<std::size_t>(part.shape[0] * out_strides[0]));
    } else if (part.shape[0] > 0) {
      fill(dst, part.shape[0] * (out_strides[0] / itemsize), itemsize, pad);
      std::int64_t src_strides[kMaxRank];
      src_strides[ndim - 1] = itemsize;
      for (int d = ndim - 2; d >= 0; --d) src_strides[d] = src_strides[d + 1] * part.shape[d + 1];
      bool any = true;
      for (int d = 1; d < ndim; ++d) any = any && part.shape[d] > 0;
      if (any) copy_block(part.data, part.shape, src_strides, dst, out_strides, 0, ndim, itemsize);
    }
    at += part.shape[0];
  }
  if (at < out_shape[0]) fill(out + at * out_strides[0], (out_shape[0] - at) * (out_strides[0] / itemsize), itemsize, pad);
}

void row_lengths(const ArrayView& array, const std::byte* pad, std::int64_t* lengths) noexcept {
  const std::int64_t rows = array.shape[0];
  const std::int64_t width = array.shape[1];
  std::size_t block = static_cast<std::size_t>(array.itemsize);  // bytes of one position along dimension 1
  for (int d = 2; d < array.ndim; ++d) block *= static_cast<std::size_t>(array.shape[d]);
  const std::size_t item = static_cast<std::size_t>(array.itemsize);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* row = array.data + static_cast<std::size_t>(r) * static_cast<std::size_t>(width) * block;
    std::int64_t reach = width;
    for (; reach > 0; --reach) {
      const std::byte* at = row + static_cast<std::size_t>(reach - 1) * block;
      bool padding = true;
      for (std::size_t b = 0; b < block && padding; b += item) padding = std::memcmp(at + b, pad, item) == 0;
      if (!padding) break;
    }
    lengths[r] = reach > 0 ? reach : 1;
  }
}

}  // namespace latte::batching
