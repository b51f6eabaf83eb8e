#include "latte/memory/detail/size_classes.hpp"

#include <string>

#include "latte/error.hpp"

namespace latte::memory::detail {
namespace {

// 64..512 in steps of 64, then four classes per doubling up to 4096.
constexpr std::size_t kClassSizes[SizeClassTable::kClasses] = {
    64,   128,  192,  256,  320,  384,  448,  512,  640,  768,
    896,  1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096};

}  // namespace

unsigned SizeClassTable::class_of(std::size_t bytes) noexcept {
  if (bytes <= 512) return bytes == 0 ? 0u : static_cast<unsigned>((bytes - 1) / 64);
  unsigned lo = 8;
  unsigned hi = kClasses - 1;
  while (lo < hi) {
    const unsigned mid = (lo + hi) / 2;
    if (kClassSizes[mid] >= bytes) hi = mid; else lo = mid + 1;
  }
  return lo;
}

std::size_t SizeClassTable::size_of(unsigned size_class) noexcept { return kClassSizes[size_class]; }

struct SlabCache::Slab {
  std::byte* base = nullptr;
  unsigned size_class = 0;
  std::uint32_t slot_bytes = 0;
  std::uint32_t slots = 0;
  std::vector<std::uint16_t> free_slots;  // stack of free slot indices
  Slab* prev = nullptr;                   // links in the class's list of slabs with free slots
  Slab* next = nullptr;
};

struct SlabCache::ClassState {
  std::mutex mutex;
  Slab* partial = nullptr;  // slabs with at least one free slot
  unsigned empty_slabs = 0; // kept so a class oscillating around a slab boundary does not thrash
};

SlabCache::SlabCache(std::byte* base, std::size_t capacity, TakeBlock take, ReturnBlock give_back)
    : base_(base), capacity_(capacity), take_(std::move(take)), give_back_(std::move(give_back)),
      classes_(new ClassState[SizeClassTable::kClasses]),
      slab_table_size_(capacity / SizeClassTable::kSlabBytes + 1) {
  slab_table_.reset(new std::atomic<Slab*>[slab_table_size_]);
  for (std::size_t i = 0; i < slab_table_size_; ++i) slab_table_[i].store(nullptr);
}

SlabCache::~SlabCache() {
  for (std::size_t i = 0; i < slab_table_size_; ++i) delete slab_table_[i].load();
}

SlabCache::Slab* SlabCache::slab_of(const void* ptr) const noexcept {
  const auto* p = static_cast<const std::byte*>(ptr);
  if (p < base_ || p >= base_ + capacity_) return nullptr;
  return slab_table_[static_cast<std::size_t>(p - base_) / SizeClassTable::kSlabBytes].load(
      std::memory_order_acquire);
}

void* SlabCache::allocate(std::size_t bytes) noexcept {
  const unsigned size_class = SizeClassTable::class_of(bytes);
  ClassState& cls = classes_[size_class];
  std::lock_guard<std::mutex> lock(cls.mutex);
  Slab* slab = cls.partial;
  if (slab == nullptr) {
    void* block = take_(SizeClassTable::kSlabBytes);
    if (block == nullptr) return nullptr;
    try {
      slab = new Slab;
      slab->base = static_cast<std::byte*>(block);
      slab->size_class = size_class;
      slab->slot_bytes = static_cast<std::uint32_t>(SizeClassTable::size_of(size_class));
      slab->slots = static_cast<std::uint32_t>(SizeClassTable::kSlabBytes / slab->slot_bytes);
      slab->free_slots.resize(slab->slots);
    } catch (...) {
      delete slab;
      give_back_(block);
      return nullptr;
    }
    // Highest index at the bottom of the stack: slots are handed out in address order.
    for (std::uint32_t i = 0; i < slab->slots; ++i) {
      slab->free_slots[i] = static_cast<std::uint16_t>(slab->slots - 1 - i);
    }
    slab_table_[static_cast<std::size_t>(slab->base - base_) / SizeClassTable::kSlabBytes].store(
        slab, std::memory_order_release);
    cls.partial = slab;
    ++cls.empty_slabs;
  }
  if (slab->free_slots.size() == slab->slots) --cls.empty_slabs;
  const std::uint16_t slot = slab->free_slots.back();
  slab->free_slots.pop_back();
  if (slab->free_slots.empty()) {
    cls.partial = slab->next;
    if (slab->next) slab->next->prev = nullptr;
    slab->next = nullptr;
  }
  allocated_.fetch_add(slab->slot_bytes, std::memory_order_relaxed);
  return slab->base + static_cast<std::size_t>(slot) * slab->slot_bytes;
}

void SlabCache::release_slab(ClassState& cls, Slab* slab) noexcept {
  if (slab->prev) slab->prev->next = slab->next; else cls.partial = slab->next;
  if (slab->next) slab->next->prev = slab->prev;
  slab_table_[static_cast<std::size_t>(slab->base - base_) / SizeClassTable::kSlabBytes].store(
      nullptr, std::memory_order_release);
  give_back_(slab->base);
  delete slab;
}

bool SlabCache::deallocate(void* ptr) noexcept {
  Slab* slab = slab_of(ptr);
  if (slab == nullptr) return false;
  ClassState& cls = classes_[slab->size_class];
  std::lock_guard<std::mutex> lock(cls.mutex);
  const auto offset = static_cast<std::size_t>(static_cast<std::byte*>(ptr) - slab->base);
  const bool was_full = slab->free_slots.empty();
  slab->free_slots.push_back(static_cast<std::uint16_t>(offset / slab->slot_bytes));
  allocated_.fetch_sub(slab->slot_bytes, std::memory_order_relaxed);
  if (was_full) {
    slab->prev = nullptr;
    slab->next = cls.partial;
    if (cls.partial) cls.partial->prev = slab;
    cls.partial = slab;
  }
  if (slab->free_slots.size() == slab->slots) {
    if (cls.empty_slabs >= 1) {
      release_slab(cls, slab);
    } else {
      ++cls.empty_slabs;
    }
  }
  return true;
}

std::size_t SlabCache::release_empty_slabs() noexcept {
  std::size_t released = 0;
  for (unsigned c = 0; c < SizeClassTable::kClasses; ++c) {
    ClassState& cls = classes_[c];
    std::lock_guard<std::mutex> lock(cls.mutex);
    Slab* slab = cls.partial;
    while (slab != nullptr && cls.empty_slabs > 0) {
      Slab* next = slab->next;
      if (slab->free_slots.size() == slab->slots) {
        release_slab(cls, slab);
        --cls.empty_slabs;
        ++released;
      }
      slab = next;
    }
  }
  return released;
}

std::size_t SlabCache::slot_size(const void* ptr) const noexcept {
  const Slab* slab = slab_of(ptr);
  return slab == nullptr ? 0 : slab->slot_bytes;
}

void SlabCache::check_invariants() const {
  std::size_t allocated = 0;
  for (unsigned c = 0; c < SizeClassTable::kClasses; ++c) {
    std::lock_guard<std::mutex> lock(classes_[c].mutex);
    unsigned empty = 0;
    for (const Slab* s = classes_[c].partial; s != nullptr; s = s->next) {
      if (s->free_slots.empty()) throw logic_error("slab invariant broken: full slab on the partial list");
      if (s->free_slots.size() == s->slots) ++empty;
      if (s->next && s->next->prev != s) throw logic_error("slab invariant broken: partial list back link");
    }
    if (empty != classes_[c].empty_slabs) throw logic_error("slab invariant broken: empty slab count");
  }
  for (std::size_t i = 0; i < slab_table_size_; ++i) {
    const Slab* s = slab_table_[i].load();
    if (s == nullptr) continue;
    if (static_cast<std::size_t>(s->base - base_) / SizeClassTable::kSlabBytes != i) {
      throw logic_error("slab invariant broken: slab table entry " + std::to_string(i) + " misplaced");
    }
    allocated += static_cast<std::size_t>(s->slots - s->free_slots.size()) * s->slot_bytes;
  }
  if (allocated != allocated_bytes()) throw logic_error("slab invariant broken: allocated byte counter");
}

}  // namespace latte::memory::detail
