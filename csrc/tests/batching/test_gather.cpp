// Checking request arrays and packing a batch, as the backend's reader and assembler use them.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../check.hpp"
#include "latte/batching/gather.hpp"
#include "latte/error.hpp"

using namespace latte::batching;

namespace {
constexpr int kInt64 = 7;
constexpr int kFloat32 = 11;

template <typename T>
ArrayView view(const std::vector<T>& data, int type, std::initializer_list<std::int64_t> shape) {
  ArrayView a;
  a.data = reinterpret_cast<const std::byte*>(data.data());
  a.type = type;
  a.itemsize = sizeof(T);
  for (std::int64_t s : shape) a.shape[a.ndim++] = s;
  return a;
}

InputRule tokens_rule() {
  InputRule rule;
  rule.type = kInt64;
  rule.ndim = 1;
  rule.dims[0] = -1;
  rule.max_rows = 4;
  rule.max_length = 16;
  return rule;
}
}  // namespace

TEST_CASE("a ragged request reports its rows and its length") {
  std::vector<std::int64_t> data(2 * 5, 1);
  const Finding f = inspect(view(data, kInt64, {2, 5}), tokens_rule());
  CHECK(f.problem == Problem::none);
  CHECK(f.rows == 2);
  CHECK(f.length == 5);
}

TEST_CASE("each broken rule is named, in the order the messages are reported") {
  std::vector<std::int64_t> ints(64, 1);
  std::vector<float> floats(64, 1.0f);
  const InputRule rule = tokens_rule();
  CHECK(inspect(view(floats, kFloat32, {1, 4}), rule).problem == Problem::dtype);
  CHECK(inspect(view(ints, kInt64, {1, 2, 2}), rule).problem == Problem::shape);
  CHECK(inspect(view(ints, kInt64, {5, 2}), rule).problem == Problem::rows);
  const Finding long_one = inspect(view(ints, kInt64, {1, 17}), rule);
  CHECK(long_one.problem == Problem::too_long);
  CHECK(long_one.detail == 17);
  CHECK(inspect(view(ints, kInt64, {1, 0}), rule).problem == Problem::empty);
  CHECK(inspect(view(ints, kInt64, {0, 3}), rule).problem == Problem::rows);
}

TEST_CASE("fixed dims must match exactly; an unbatched input counts one row") {
  std::vector<float> data(3 * 8, 0.5f);
  InputRule rule;
  rule.type = kFloat32;
  rule.ndim = 2;
  rule.dims[0] = 3;
  rule.dims[1] = 8;
  rule.batched = false;
  CHECK(inspect(view(data, kFloat32, {3, 8}), rule).rows == 1);
  CHECK(inspect(view(data, kFloat32, {3, 8}), rule).length == -1);
  CHECK(inspect(view(data, kFloat32, {8, 3}), rule).problem == Problem::shape);
}

TEST_CASE("non-finite values are found by flat index, only when asked") {
  std::vector<float> data(2 * 4, 1.0f);
  data[6] = std::numeric_limits<float>::quiet_NaN();
  InputRule rule;
  rule.type = kFloat32;
  rule.float_kind = FloatKind::f32;
  rule.ndim = 1;
  rule.dims[0] = 4;
  rule.max_rows = 8;
  CHECK(inspect(view(data, kFloat32, {2, 4}), rule).problem == Problem::none);
  rule.reject_nonfinite = true;
  const Finding f = inspect(view(data, kFloat32, {2, 4}), rule);
  CHECK(f.problem == Problem::nonfinite);
  CHECK(f.detail == 6);
  std::vector<std::uint16_t> halves(4, 0x3C00);  // 1.0 in fp16
  halves[2] = 0x7C00;                             // +infinity
  rule.type = 23;
  rule.float_kind = FloatKind::f16;
  CHECK(inspect(view(halves, 23, {1, 4}), rule).detail == 2);
}

TEST_CASE("integer values outside the declared range are found by flat index") {
  std::vector<std::int64_t> ids = {1, 5, 999, 1000, 3};
  InputRule rule = tokens_rule();
  rule.max_length = 0;
  CHECK(inspect(view(ids, kInt64, {1, 5}), rule).problem == Problem::none);  // no range declared
  rule.int_bits = 64;
  rule.low = 0;
  rule.high = 999;
  const Finding f = inspect(view(ids, kInt64, {1, 5}), rule);
  CHECK(f.problem == Problem::out_of_range);
  CHECK(f.detail == 3);
  ids[3] = -3;  // a negative id would wrap around in an ONNX Gather
  CHECK(inspect(view(ids, kInt64, {1, 5}), rule).detail == 3);
  std::vector<std::uint8_t> bytes = {0, 7, 200};
  InputRule small;
  small.type = 2;
  small.ndim = 1;
  small.dims[0] = 3;
  small.max_rows = 1;
  small.int_bits = 8;
  small.int_signed = false;
  small.low = 0;
  small.high = 199;
  CHECK(inspect(view(bytes, 2, {1, 3}), small).detail == 2);
}

TEST_CASE("ragged parts are padded to the batch's shape, row after row") {
  std::vector<std::int64_t> a = {1, 2}, b = {3, 4, 5, 6, 7, 8};  // (1, 2) and (2, 3)
  const ArrayView parts[] = {view(a, kInt64, {1, 2}), view(b, kInt64, {2, 3})};
  std::vector<std::int64_t> out(4 * 4, -1);
  const std::int64_t shape[] = {4, 4};
  const std::int64_t pad = 0;
  pack(parts, 2, reinterpret_cast<std::byte*>(out.data()), shape, 2, 8, reinterpret_cast<const std::byte*>(&pad));
  const std::vector<std::int64_t> expected = {1, 2, 0, 0, 3, 4, 5, 0, 6, 7, 8, 0, 0, 0, 0, 0};
  CHECK(out == expected);
}

TEST_CASE("a pad value whose bytes differ is written element by element") {
  std::vector<float> a = {1.0f};
  const ArrayView parts[] = {view(a, kFloat32, {1, 1, 1})};
  std::vector<float> out(2 * 2, 0.0f);
  const std::int64_t shape[] = {1, 2, 2};
  const float pad = -1.5f;
  pack(parts, 1, reinterpret_cast<std::byte*>(out.data()), shape, 3, 4, reinterpret_cast<const std::byte*>(&pad));
  CHECK(out == (std::vector<float>{1.0f, -1.5f, -1.5f, -1.5f}));
}

TEST_CASE("packing equals a reference copy on seeded random shapes") {
  std::mt19937 rng(20261122);
  for (int trial = 0; trial < 200; ++trial) {
    const int count = 1 + static_cast<int>(rng() % 6);
    const std::int64_t inner = 1 + rng() % 3;  // a fixed trailing dimension
    std::vector<std::vector<std::int32_t>> data(count);
    std::vector<ArrayView> parts(count);
    std::int64_t rows = 0, longest = 1;
    for (int p = 0; p < count; ++p) {
      const std::int64_t r = 1 + rng() % 3, n = 1 + rng() % 9;
      data[p].resize(r * n * inner);
      for (auto& v : data[p]) v = static_cast<std::int32_t>(rng() % 1000) + 1;
      parts[p] = view(data[p], 5, {r, n, inner});
      rows += r;
      longest = std::max(longest, n);
    }
    const std::int64_t shape[] = {rows, longest + static_cast<std::int64_t>(rng() % 2), inner};
    std::vector<std::int32_t> out(shape[0] * shape[1] * shape[2], 7);
    const std::int32_t pad = 0;
    pack(parts.data(), parts.size(), reinterpret_cast<std::byte*>(out.data()), shape, 3, 4,
         reinterpret_cast<const std::byte*>(&pad));
    std::vector<std::int32_t> expected(out.size(), 0);
    std::int64_t at = 0;
    for (int p = 0; p < count; ++p) {
      for (std::int64_t r = 0; r < parts[p].shape[0]; ++r, ++at) {
        for (std::int64_t n = 0; n < parts[p].shape[1]; ++n) {
          for (std::int64_t k = 0; k < inner; ++k) {
            expected[(at * shape[1] + n) * inner + k] = data[p][(r * parts[p].shape[1] + n) * inner + k];
          }
        }
      }
    }
    CHECK(out == expected);
  }
}

TEST_CASE("a part larger than the batch is a precondition failure, not an overrun") {
  std::vector<std::int64_t> a(1 * 5, 1);
  const ArrayView parts[] = {view(a, kInt64, {1, 5})};
  std::vector<std::int64_t> out(4, 0);
  const std::int64_t shape[] = {1, 4};
  const std::int64_t pad = 0;
  bool refused = false;
  try {
    pack(parts, 1, reinterpret_cast<std::byte*>(out.data()), shape, 2, 8, reinterpret_cast<const std::byte*>(&pad));
  } catch (const latte::logic_error& e) {
    refused = std::strstr(e.what(), "larger than out") != nullptr;
  }
  CHECK(refused);
}

int main() { return latte::testing::run_all(); }

TEST_CASE("a padded batch's rows are measured up to their last value that is not padding") {
  // Rows of token ids padded with 0 to the longest; a 0 inside a row is a value, not padding.
  std::vector<std::int64_t> ids = {5, 0, 7, 0, 0,
                                   3, 0, 0, 0, 0,
                                   0, 0, 0, 0, 0,
                                   1, 2, 3, 4, 5};
  const std::int64_t zero = 0;
  std::int64_t lengths[4] = {};
  row_lengths(view(ids, kInt64, {4, 5}), reinterpret_cast<const std::byte*>(&zero), lengths);
  CHECK(lengths[0] == 3);
  CHECK(lengths[1] == 1);
  CHECK(lengths[2] == 1);  // all padding: the row is still there
  CHECK(lengths[3] == 5);
}

TEST_CASE("a position of a deeper batch is padding only when all its elements are") {
  // [rows 2, positions 3, features 2]: row 0 reaches position 2 through one feature.
  std::vector<float> values = {1, 1, 0, 0, 0, 2,
                               1, 0, 0, 0, 0, 0};
  const float zero = 0.0f;
  std::int64_t lengths[2] = {};
  row_lengths(view(values, kFloat32, {2, 3, 2}), reinterpret_cast<const std::byte*>(&zero), lengths);
  CHECK(lengths[0] == 3);
  CHECK(lengths[1] == 1);
}
