#include "memory/buddy_allocator.h"

#include <algorithm>
#include <bit>

namespace hiber::memory {
namespace {

// span_owner_ of a page that heads no live allocation (never read there).
constexpr FunctionId kNoOwner{0};

// Orders are in pages (minimum blocks): order k is 2^k pages. 2^31 pages of 2 MiB is 4 PiB.
constexpr int kMaxOrderLimit = 31;

int floor_log2(uint64_t value) { return 63 - std::countl_zero(value); }
int ceil_log2(uint64_t value) { return value <= 1 ? 0 : floor_log2(value - 1) + 1; }

}  // namespace

Result<std::unique_ptr<BuddyAllocator>> BuddyAllocator::create(
    const std::vector<uint64_t>& chunk_bytes, BuddyOptions options) {
  const uint64_t min = options.min_block_bytes;
  if (min == 0 || !std::has_single_bit(min)) {
    return error(ErrorCode::kInvalidValue, "buddy: the minimum block (", min,
                 " bytes) must be a power of two");
  }
  for (uint64_t size : options.shared_sizes) {
    if (size == 0 || size % min != 0) {
      return error(ErrorCode::kInvalidValue, "buddy: shared size ", size,
                   " is not a multiple of the minimum block ", min);
    }
  }
  uint64_t largest_pages = 1;
  for (uint64_t bytes : chunk_bytes) largest_pages = std::max(largest_pages, bytes / min);
  const int max_order = std::min(floor_log2(largest_pages), kMaxOrderLimit);
  std::unique_ptr<BuddyAllocator> allocator(
      new BuddyAllocator(std::move(options), std::countr_zero(min), max_order));
  for (uint64_t bytes : chunk_bytes) {
    auto added = allocator->add_chunk(bytes);
    if (!added.ok()) return added.status();
  }
  return allocator;
}

BuddyAllocator::BuddyAllocator(BuddyOptions options, int page_shift, int max_order)
    : options_(std::move(options)), page_shift_(page_shift), max_order_(max_order) {
  free_count_.assign(orders(), 0);
  for (uint64_t size : options_.shared_sizes) {
    shared_pages_.push_back(static_cast<uint32_t>(size >> page_shift_));
  }
  shared_cache_.resize(shared_pages_.size());
}

Result<uint32_t> BuddyAllocator::add_chunk(uint64_t bytes) {
  const uint64_t min = min_block_bytes();
  if (bytes == 0 || bytes % min != 0) {
    return error(ErrorCode::kInvalidValue, "buddy: chunk of ", bytes,
                 " bytes is not a positive multiple of the minimum block ", min);
  }
  const uint64_t pages = bytes / min;
  if (capacity_pages_ + pages >= kNone) {
    return error(ErrorCode::kInvalidValue, "buddy: more than ", kNone - 1, " pages in one pool");
  }
  if (const int order = floor_log2(pages); order > max_order_) raise_max_order(order);
  const auto chunk = static_cast<uint32_t>(chunks_.size());
  const auto first = static_cast<uint32_t>(capacity_pages_);
  chunks_.push_back(Chunk{first, static_cast<uint32_t>(pages)});
  free_versions_.push_back(0);
  live_versions_.push_back(0);
  free_pages_.push_back(0);
  runs_.emplace_back();
  regions_.resize(chunks_.size() * orders());
  heads_.resize(chunks_.size() * orders(), kNone);
  const size_t words = (chunks_.size() + 63) / 64;
  if (words != nonempty_words_) {
    std::vector<uint64_t> grown(orders() * words, 0);
    for (int k = 0; k < orders(); ++k) {
      for (size_t w = 0; w < nonempty_words_; ++w) {
        grown[k * words + w] = nonempty_[k * nonempty_words_ + w];
      }
    }
    nonempty_ = std::move(grown);
    nonempty_words_ = words;
  }
  const size_t total = capacity_pages_ + pages;
  free_order_.resize(total, -1);
  next_.resize(total, kNone);
  prev_.resize(total, kNone);
  page_chunk_.resize(total, chunk);
  span_pages_.resize(total, 0);
  span_owner_.resize(total, kNoOwner);
  span_requested_.resize(total, 0);
  span_cached_.resize(total, 0);
  free_bits_.resize((total + 63) / 64, 0);
  capacity_pages_ = total;
  free_range(chunk, 0, static_cast<uint32_t>(pages));
  if (options_.shared_cache_bytes == 0) {
    shared_cache_limit_ = (capacity_pages_ << page_shift_) / 16;
  } else {
    shared_cache_limit_ = options_.shared_cache_bytes;
  }
  return chunk;
}

// Every chunk so far is smaller than twice the largest block, so no free block of theirs gains a
// buddy: only the per-order arrays grow.
void BuddyAllocator::raise_max_order(int order) {
  const int old_orders = orders();
  max_order_ = order;
  std::vector<uint32_t> heads(chunks_.size() * orders(), kNone);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    std::copy_n(&heads_[c * old_orders], old_orders, &heads[c * orders()]);
  }
  heads_ = std::move(heads);
  regions_.assign(chunks_.size() * orders(), ChunkRegions{});
  nonempty_.resize(orders() * nonempty_words_, 0);  // order-major: new orders go at the end
  free_count_.resize(orders(), 0);
}

uint64_t BuddyAllocator::max_request_bytes() const {
  return uint64_t{1} << (max_order_ + page_shift_);
}

// ---- Free lists ----

void BuddyAllocator::set_nonempty(int order, uint32_t chunk, bool nonempty) {
  uint64_t& word = nonempty_[order * nonempty_words_ + chunk / 64];
  const uint64_t bit = uint64_t{1} << (chunk % 64);
  word = nonempty ? (word | bit) : (word & ~bit);
}

void BuddyAllocator::mark_free(uint32_t page, uint32_t pages, bool free) {
  for (uint64_t at = page, end = uint64_t{page} + pages; at < end;) {
    const uint64_t bit = at % 64;
    const uint64_t count = std::min<uint64_t>(64 - bit, end - at);
    const uint64_t mask = (count == 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1) << bit;
    uint64_t& word = free_bits_[at / 64];
    word = free ? (word | mask) : (word & ~mask);
    at += count;
  }
}

uint64_t BuddyAllocator::next_page_with(uint64_t page, uint64_t end, bool want) const {
  if (page >= end) return end;
  uint64_t w = page / 64;
  const uint64_t flip = want ? 0 : ~uint64_t{0};
  uint64_t bits = (free_bits_[w] ^ flip) & (~uint64_t{0} << (page % 64));
  while (bits == 0) {
    if (++w * 64 >= end) return end;
    bits = free_bits_[w] ^ flip;
  }
  return std::min(end, w * 64 + std::countr_zero(bits));
}

void BuddyAllocator::push_free(uint32_t chunk, uint32_t page, int order) {
  uint32_t& first = head(chunk, order);
  mark_free(page, uint32_t{1} << order, true);
  free_order_[page] = static_cast<int8_t>(order);
  ++free_versions_[chunk];
  free_pages_[chunk] += uint32_t{1} << order;
  prev_[page] = kNone;
  next_[page] = first;
  if (first != kNone) prev_[first] = page;
  if (first == kNone) set_nonempty(order, chunk, true);
  first = page;
  ++free_count_[order];
}

void BuddyAllocator::remove_free(uint32_t chunk, uint32_t page, int order) {
  if (prev_[page] != kNone) {
    next_[prev_[page]] = next_[page];
  } else {
    head(chunk, order) = next_[page];
  }
  if (next_[page] != kNone) prev_[next_[page]] = prev_[page];
  if (head(chunk, order) == kNone) set_nonempty(order, chunk, false);
  mark_free(page, uint32_t{1} << order, false);
  free_order_[page] = -1;
  ++free_versions_[chunk];
  free_pages_[chunk] -= uint32_t{1} << order;
  next_[page] = prev_[page] = kNone;
  --free_count_[order];
}

void BuddyAllocator::free_block(uint32_t chunk, uint32_t rel, int order) {
  const Chunk& c = chunks_[chunk];
  while (order < max_order_) {
    const uint32_t buddy = rel ^ (uint32_t{1} << order);
    if (buddy + (uint64_t{1} << order) > c.pages) break;
    if (free_order_[c.first_page + buddy] != order) break;
    remove_free(chunk, c.first_page + buddy, order);
    ++counters_.merges;
    rel = std::min(rel, buddy);
    ++order;
  }
  push_free(chunk, c.first_page + rel, order);
}

void BuddyAllocator::free_range(uint32_t chunk, uint32_t rel, uint32_t pages) {
  uint64_t pos = rel;
  const uint64_t end = uint64_t{rel} + pages;
  while (pos < end) {
    int order = pos == 0 ? max_order_ : std::min(std::countr_zero(pos), max_order_);
    while ((uint64_t{1} << order) > end - pos) --order;
    free_block(chunk, static_cast<uint32_t>(pos), order);
    pos += uint64_t{1} << order;
  }
}

uint32_t BuddyAllocator::chunk_with_free(int order) const {
  const uint64_t* words = &nonempty_[order * nonempty_words_];
  for (size_t w = 0; w < nonempty_words_; ++w) {
    if (words[w] != 0) return static_cast<uint32_t>(w * 64 + std::countr_zero(words[w]));
  }
  return kNone;
}

int BuddyAllocator::shared_index(uint32_t pages) const {
  for (size_t i = 0; i < shared_pages_.size(); ++i) {
    if (shared_pages_[i] == pages) return static_cast<int>(i);
  }
  return -1;
}

// ---- Allocation ----

void BuddyAllocator::record_span(uint32_t page, uint32_t pages, FunctionId owner, OwnerState& state,
                                 uint64_t requested) {
  span_pages_[page] = pages;
  span_owner_[page] = owner;
  span_requested_[page] = requested;
  span_cached_[page] = 0;
  ++live_versions_[page_chunk_[page]];
  allocated_pages_ += pages;
  requested_bytes_ += requested;
  ++live_allocations_;
  ++counters_.allocations;
  state.home_chunk = page_chunk_[page];
  state.last_page = page;
  ++state.live;
}

Allocation BuddyAllocator::take(uint32_t chunk, uint32_t page, int found, int order, uint32_t pages,
                                FunctionId owner, OwnerState& state, uint64_t requested) {
  remove_free(chunk, page, found);
  for (int k = found; k > order; --k) {
    push_free(chunk, page + (uint32_t{1} << (k - 1)), k - 1);
    ++counters_.splits;
  }
  const uint32_t rel = page - chunks_[chunk].first_page;
  const uint32_t block_pages = uint32_t{1} << order;
  if (pages < block_pages) free_range(chunk, rel + pages, block_pages - pages);
  record_span(page, pages, owner, state, requested);
  return Allocation{{chunk, uint64_t{rel} << page_shift_}, uint64_t{pages} << page_shift_};
}

uint32_t BuddyAllocator::run_after_latest(const OwnerState& state, FunctionId id,
                                          uint32_t pages) const {
  const uint32_t last = state.last_page;
  const uint32_t span = span_pages_[last];
  if (span == 0 || span_cached_[last] || span_owner_[last] != id) return kNone;
  const Chunk& c = chunks_[page_chunk_[last]];
  const uint64_t start = last + span;
  const uint64_t end = start + pages;
  if (end > uint64_t{c.first_page} + c.pages) return kNone;
  // Free blocks are maximal, so at most about 2 log2(pages) of them cover the run.
  for (uint64_t page = start; page < end; page += uint64_t{1} << free_order_[page]) {
    if (free_order_[page] < 0) return kNone;
  }
  return static_cast<uint32_t>(start);
}

Allocation BuddyAllocator::take_run(uint32_t chunk, uint32_t page, uint32_t pages, FunctionId owner,
                                    OwnerState& state, uint64_t requested) {
  const uint32_t first = chunks_[chunk].first_page;
  const uint32_t end = page + pages;
  for (uint32_t at = page; at < end;) {
    const int order = free_order_[at];
    const uint32_t block_end = at + (uint32_t{1} << order);
    remove_free(chunk, at, order);
    if (block_end > end) {
      free_range(chunk, end - first, block_end - end);
      ++counters_.splits;
    }
    at = block_end;
  }
  record_span(page, pages, owner, state, requested);
  return Allocation{{chunk, uint64_t{page - first} << page_shift_}, uint64_t{pages} << page_shift_};
}

template <typename Visit>
void BuddyAllocator::for_each_free_run(uint32_t chunk, Visit&& visit) const {
  const Chunk& c = chunks_[chunk];
  const uint64_t first = c.first_page;
  const uint64_t end = first + c.pages;
  // One pass over the chunk's words; a run may span words, so it stays open across them.
  uint64_t start = 0;
  bool open = false;
  for (uint64_t base = first / 64 * 64; base < end; base += 64) {
    uint64_t bits = free_bits_[base / 64];
    if (base < first) bits &= ~uint64_t{0} << (first - base);
    if (end - base < 64) bits &= (uint64_t{1} << (end - base)) - 1;
    for (uint64_t pos = 0;;) {
      const uint64_t rest = (open ? ~bits : bits) & (~uint64_t{0} << pos);
      if (rest == 0) break;
      pos = std::countr_zero(rest);
      if (open) visit(static_cast<uint32_t>(start), base + pos - start);
      start = base + pos;
      open = !open;
    }
  }
  if (open) visit(static_cast<uint32_t>(start), end - start);
}

// A run of 2^(k+1) - 1 free pages or more holds an aligned block of 2^k pages, which the
// coalescing makes one free block of order k or more. So a chunk whose largest free block has
// order m has no run longer than 2^(m+2) - 2 (while m < max_order_, above which nothing
// coalesces).
uint64_t BuddyAllocator::longest_run_bound(uint32_t chunk) const {
  for (int k = max_order_; k >= 0; --k) {
    if (head(chunk, k) == kNone) continue;
    return k >= max_order_ ? UINT64_MAX : (uint64_t{1} << (k + 2)) - 2;
  }
  return 0;
}

uint32_t BuddyAllocator::find_free_run(uint32_t pages) {
  uint32_t best = kNone;
  uint64_t best_length = UINT64_MAX;
  for (uint32_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    ChunkRuns& cached = runs_[chunk];
    if (free_pages_[chunk] < pages || longest_run_bound(chunk) < pages) continue;
    if (cached.version != free_versions_[chunk]) {
      cached.runs.clear();
      cached.longest = 0;
      // A run lies inside one chunk, and a chunk has fewer than 2^32 pages.
      for_each_free_run(chunk, [&](uint32_t start, uint64_t length) {
        cached.runs.emplace_back(start, static_cast<uint32_t>(length));
        cached.longest = std::max(cached.longest, static_cast<uint32_t>(length));
      });
      cached.version = free_versions_[chunk];
    }
    if (cached.longest < pages) continue;
    for (const auto& [start, length] : cached.runs) {
      if (length >= pages && length < best_length) {
        best = start;
        best_length = length;
      }
    }
  }
  return best;
}

uint64_t BuddyAllocator::largest_free_run_bytes() const {
  uint64_t largest = 0;
  for (uint32_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    for_each_free_run(chunk,
                      [&](uint32_t, uint64_t length) { largest = std::max(largest, length); });
  }
  return largest << page_shift_;
}

std::pair<uint32_t, int> BuddyAllocator::near_latest(const OwnerState& state, FunctionId id,
                                                     int order) const {
  const uint32_t last = state.last_page;
  const uint32_t span = span_pages_[last];
  if (span == 0 || span_cached_[last] || span_owner_[last] != id) return {kNone, -1};
  const Chunk& c = chunks_[page_chunk_[last]];
  const uint32_t rel = last - c.first_page;
  // The free buddies of its ancestors, nearest first.
  for (int j = std::max(ceil_log2(span), order); j < max_order_; ++j) {
    const uint32_t sibling = (rel & ~((uint32_t{1} << j) - 1)) ^ (uint32_t{1} << j);
    if (sibling + (uint64_t{1} << j) > c.pages) continue;
    if (free_order_[c.first_page + sibling] == j) return {c.first_page + sibling, j};
  }
  return {kNone, -1};
}

AllocationResult BuddyAllocator::do_allocate(uint64_t bytes, FunctionId owner,
                                             const EvictablePredicate& evictable,
                                             EvictionAdvice advice) {
  const uint64_t pages64 = (bytes + min_block_bytes() - 1) >> page_shift_;
  const int order = ceil_log2(pages64);
  const auto block_pages = static_cast<uint32_t>(uint64_t{1} << order);
  const uint32_t pages = options_.trim_tail ? static_cast<uint32_t>(pages64) : block_pages;

  // One lookup of the owner for the whole request; a new owner's entry goes again on failure.
  auto [known, new_owner] = owners_.try_emplace(owner);
  OwnerState& state = known->second;

  // Sharing: a cached block of exactly this size, preferably in the requester's home chunk.
  if (const int shared = shared_index(pages); shared >= 0 && !shared_cache_[shared].empty()) {
    std::vector<uint32_t>& cache = shared_cache_[shared];
    size_t pick = cache.size() - 1;
    if (options_.consolidate && !new_owner) {
      // Look at the few most recent entries only: O(1), and recent ones are warm.
      for (size_t i = cache.size(), seen = 0; i-- > 0 && seen < 8; ++seen) {
        if (page_chunk_[cache[i]] == state.home_chunk) {
          pick = i;
          break;
        }
      }
    }
    const uint32_t page = cache[pick];
    cache[pick] = cache.back();
    cache.pop_back();
    cached_pages_ -= pages;
    ++counters_.cache_hits;
    record_span(page, pages, owner, state, bytes);
    return Allocation{
        {page_chunk_[page], uint64_t{page - chunks_[page_chunk_[page]].first_page} << page_shift_},
        uint64_t{pages} << page_shift_};
  }

  const int region_order = std::min(
      max_order_, ceil_log2(std::max<uint64_t>(1, options_.home_region_bytes >> page_shift_)));
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (options_.consolidate && !new_owner) {
      if (const uint32_t page = run_after_latest(state, owner, pages); page != kNone) {
        return take_run(page_chunk_[page], page, pages, owner, state, bytes);
      }
      if (auto [page, found] = near_latest(state, owner, order); found >= 0) {
        return take(page_chunk_[page], page, found, order, pages, owner, state, bytes);
      }
      const uint32_t home = state.home_chunk;
      for (int k = order; k <= max_order_; ++k) {
        if (head(home, k) != kNone) {
          return take(home, head(home, k), k, order, pages, owner, state, bytes);
        }
      }
    }
    // Best fit; a new function (with consolidation) gets a region of its own to grow in.
    int found = -1;
    const bool new_region = options_.consolidate && new_owner;
    for (int k = new_region ? std::max(order, region_order) : order; k <= max_order_; ++k) {
      if (free_count_[k] != 0) {
        found = k;
        break;
      }
    }
    for (int k = max_order_; found < 0 && k >= order; --k) {
      if (free_count_[k] != 0) found = k;
    }
    if (found >= 0) {
      const uint32_t chunk = chunk_with_free(found);
      return take(chunk, head(chunk, found), found, order, pages, owner, state, bytes);
    }
    // No aligned block is large enough; smaller free blocks side by side may be.
    if (const uint32_t page = find_free_run(pages); page != kNone) {
      return take_run(page_chunk_[page], page, pages, owner, state, bytes);
    }
    if (attempt == 0 && cached_pages_ == 0) break;
    release_cached();
  }
  if (new_owner) owners_.erase(known);
  ++counters_.failures;
  if ((capacity_pages_ - allocated_pages_) >= pages) ++counters_.fragmentation_failures;
  return make_shortfall(bytes, pages, order, owner, evictable, advice);
}

const BuddyAllocator::ChunkRegions& BuddyAllocator::regions(uint32_t chunk, int order) {
  ChunkRegions& cached = regions_[chunk * orders() + order];
  if (cached.version == live_versions_[chunk]) return cached;
  const Chunk& c = chunks_[chunk];
  const uint64_t region_pages = uint64_t{1} << order;
  const uint64_t count = c.pages / region_pages;
  cached.pages.assign(count, 0);
  cached.first.assign(count, kNone);
  for (uint64_t pos = 0; pos < count * region_pages;) {
    const uint32_t page = c.first_page + static_cast<uint32_t>(pos);
    if (free_order_[page] >= 0) {
      pos += uint64_t{1} << free_order_[page];
      continue;
    }
    const uint32_t span = span_pages_[page];
    if (span == 0) {  // cannot happen while the invariants hold; never loop forever
      ++pos;
      continue;
    }
    if (!span_cached_[page]) {
      const uint64_t last = std::min(pos + span, count * region_pages) - 1;
      for (uint64_t r = pos / region_pages; r <= last / region_pages; ++r) {
        cached.pages[r] += span;
        if (cached.first[r] == kNone) cached.first[r] = static_cast<uint32_t>(pos);
      }
    }
    pos += span;
  }
  for (uint64_t r = 0; r < count; ++r) {
    if (cached.first[r] == kNone) cached.first[r] = static_cast<uint32_t>(r * region_pages);
  }
  cached.version = live_versions_[chunk];
  return cached;
}

template <typename Visit>
void BuddyAllocator::for_each_allocation_in(uint32_t chunk, uint32_t from, uint64_t begin,
                                            uint64_t end, Visit&& visit) const {
  const Chunk& c = chunks_[chunk];
  for (uint64_t pos = from; pos < end;) {
    const uint32_t page = c.first_page + static_cast<uint32_t>(pos);
    if (free_order_[page] >= 0) {
      pos += uint64_t{1} << free_order_[page];
      continue;
    }
    const uint32_t span = span_pages_[page];
    if (span == 0) {
      ++pos;
      continue;
    }
    if (!span_cached_[page] && pos + span > begin && !visit(page, span)) return;
    pos += span;
  }
}

Shortfall BuddyAllocator::make_shortfall(uint64_t bytes, uint32_t pages, int order,
                                         FunctionId owner, const EvictablePredicate& evictable,
                                         EvictionAdvice advice) {
  Shortfall shortfall;
  shortfall.requested_bytes = bytes;
  shortfall.needed_bytes = uint64_t{pages} << page_shift_;
  shortfall.free_bytes = (capacity_pages_ - allocated_pages_) << page_shift_;
  shortfall.largest_free_bytes = largest_free_bytes();
  if (advice == EvictionAdvice::kSkipped) return shortfall;
  const auto may_evict = [&](FunctionId f) { return evictable ? evictable(f) : f != owner; };

  // The request needs a free aligned region of 2^order pages. Evicting an allocation that
  // overlaps a region frees all of it, so a region costs the pages of the allocations that
  // overlap it; the answer is the cheapest region that holds nothing protected, the first
  // (by chunk, then offset) among equals. The costs are kept per chunk and order until the
  // chunk changes (regions()); protection depends on the request, so it is checked, cheapest
  // first, for the candidates alone.
  const uint64_t region_pages = uint64_t{1} << order;
  const auto blocked = [&](uint32_t chunk, uint64_t r, uint32_t from) {
    bool holds_protected = false;
    for_each_allocation_in(chunk, from, r * region_pages, (r + 1) * region_pages,
                           [&](uint32_t page, uint32_t) {
                             holds_protected = !may_evict(span_owner_[page]);
                             return !holds_protected;
                           });
    return holds_protected;
  };
  uint64_t level = 0;  // every cost below has been looked at
  bool found = false;
  uint32_t best_chunk = 0;
  uint64_t best_region = 0;
  uint64_t best_cost = 0;
  while (!found) {
    uint64_t cheapest = UINT64_MAX;
    for (uint32_t chunk = 0; chunk < chunks_.size(); ++chunk) {
      for (uint64_t cost : regions(chunk, order).pages) {
        if (cost >= level) cheapest = std::min(cheapest, cost);
      }
    }
    if (cheapest == UINT64_MAX) break;
    for (uint32_t chunk = 0; chunk < chunks_.size() && !found; ++chunk) {
      const ChunkRegions& costs = regions(chunk, order);
      for (uint64_t r = 0; r < costs.pages.size(); ++r) {
        if (costs.pages[r] != cheapest || blocked(chunk, r, costs.first[r])) continue;
        found = true;
        best_chunk = chunk;
        best_region = r;
        best_cost = cheapest;
        break;
      }
    }
    level = cheapest + 1;
  }
  if (found) {
    std::vector<OwnerBytes> best_owners;
    for_each_allocation_in(
        best_chunk, regions(best_chunk, order).first[best_region], best_region * region_pages,
        (best_region + 1) * region_pages, [&](uint32_t page, uint32_t span) {
          const FunctionId f = span_owner_[page];
          auto it = std::find_if(best_owners.begin(), best_owners.end(),
                                 [f](const OwnerBytes& o) { return o.function == f; });
          if (it == best_owners.end()) {
            best_owners.push_back({f, uint64_t{span} << page_shift_});
          } else {
            it->bytes += uint64_t{span} << page_shift_;
          }
          return true;
        });
    std::sort(best_owners.begin(), best_owners.end(), [](const OwnerBytes& a, const OwnerBytes& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.function < b.function;
    });
    shortfall.evict_bytes = best_cost << page_shift_;
    shortfall.evict = std::move(best_owners);
  }
  return shortfall;
}

std::optional<FunctionId> BuddyAllocator::owner(const Allocation& allocation) const noexcept {
  const PoolLocation& where = allocation.where;
  if (where.chunk >= chunks_.size() || where.offset % min_block_bytes() != 0 ||
      (where.offset >> page_shift_) >= chunks_[where.chunk].pages) {
    return std::nullopt;
  }
  const uint32_t page =
      chunks_[where.chunk].first_page + static_cast<uint32_t>(where.offset >> page_shift_);
  const uint32_t pages = span_pages_[page];
  if (pages == 0 || span_cached_[page] || (uint64_t{pages} << page_shift_) != allocation.bytes) {
    return std::nullopt;
  }
  return span_owner_[page];
}

Status BuddyAllocator::do_deallocate(const Allocation& allocation) noexcept {
  const PoolLocation& where = allocation.where;
  const uint64_t min = min_block_bytes();
  if (where.chunk >= chunks_.size() || where.offset % min != 0 ||
      where.offset / min >= chunks_[where.chunk].pages) {
    return error(ErrorCode::kInvalidValue, "buddy: no allocation at chunk ", where.chunk,
                 " offset ", where.offset);
  }
  const Chunk& c = chunks_[where.chunk];
  const auto rel = static_cast<uint32_t>(where.offset >> page_shift_);
  const uint32_t page = c.first_page + rel;
  const uint32_t pages = span_pages_[page];
  if (pages == 0 || span_cached_[page] || (uint64_t{pages} << page_shift_) != allocation.bytes) {
    return error(ErrorCode::kInvalidValue, "buddy: no live allocation of ", allocation.bytes,
                 " bytes at chunk ", where.chunk, " offset ", where.offset);
  }
  const FunctionId owner = span_owner_[page];
  if (auto it = owners_.find(owner); it != owners_.end() && --it->second.live == 0) {
    owners_.erase(it);
  }
  ++live_versions_[where.chunk];
  allocated_pages_ -= pages;
  requested_bytes_ -= span_requested_[page];
  --live_allocations_;
  ++counters_.deallocations;

  const int shared = shared_index(pages);
  if (shared >= 0 && ((cached_pages_ + pages) << page_shift_) <= shared_cache_limit_) {
    span_cached_[page] = 1;
    span_owner_[page] = kNoOwner;
    span_requested_[page] = 0;
    cached_pages_ += pages;
    shared_cache_[shared].push_back(page);
    return Status();
  }
  span_pages_[page] = 0;
  span_owner_[page] = kNoOwner;
  span_requested_[page] = 0;
  free_range(where.chunk, rel, pages);
  return Status();
}

void BuddyAllocator::release_cached() noexcept {
  for (std::vector<uint32_t>& cache : shared_cache_) {
    for (uint32_t page : cache) {
      const uint32_t chunk = page_chunk_[page];
      const uint32_t pages = span_pages_[page];
      span_pages_[page] = 0;
      span_cached_[page] = 0;
      cached_pages_ -= pages;
      free_range(chunk, page - chunks_[chunk].first_page, pages);
    }
    cache.clear();
  }
}

// ---- Reports ----

uint64_t BuddyAllocator::largest_free_bytes() const {
  for (int k = max_order_; k >= 0; --k) {
    if (free_count_[k] != 0) return uint64_t{1} << (k + page_shift_);
  }
  return 0;
}

PoolStats BuddyAllocator::stats() const {
  PoolStats stats = counters_;
  stats.max_block_bytes = max_request_bytes();
  stats.capacity_bytes = capacity_pages_ << page_shift_;
  stats.allocated_bytes = allocated_pages_ << page_shift_;
  stats.requested_bytes = requested_bytes_;
  stats.cached_bytes = cached_pages_ << page_shift_;
  stats.free_bytes = stats.capacity_bytes - stats.allocated_bytes - stats.cached_bytes;
  stats.largest_free_bytes = largest_free_bytes();
  stats.live_allocations = live_allocations_;
  return stats;
}

std::vector<std::pair<PoolLocation, uint64_t>> BuddyAllocator::free_blocks() const {
  std::vector<std::pair<PoolLocation, uint64_t>> blocks;
  for (uint32_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    const Chunk& c = chunks_[chunk];
    for (uint32_t rel = 0; rel < c.pages; ++rel) {
      const int8_t order = free_order_[c.first_page + rel];
      if (order < 0) continue;
      blocks.push_back(
          {{chunk, uint64_t{rel} << page_shift_}, uint64_t{1} << (order + page_shift_)});
    }
  }
  return blocks;
}

Status BuddyAllocator::check_invariants() const {
  uint64_t free_pages = 0, allocated = 0, cached = 0, live = 0, requested = 0;
  std::vector<uint64_t> heads_seen(heads_.size(), 0);
  for (uint32_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    const Chunk& c = chunks_[chunk];
    for (uint64_t rel = 0; rel < c.pages;) {
      const uint32_t page = c.first_page + static_cast<uint32_t>(rel);
      if (page_chunk_[page] != chunk) {
        return error(ErrorCode::kIllegalState, "page ", page, " names chunk ", page_chunk_[page]);
      }
      const int order = free_order_[page];
      uint64_t length;
      if (order >= 0) {
        if (span_pages_[page] != 0) {
          return error(ErrorCode::kIllegalState, "page ", page, " is both free and allocated");
        }
        length = uint64_t{1} << order;
        if (rel % length != 0 || rel + length > c.pages) {
          return error(ErrorCode::kIllegalState, "free block at chunk ", chunk, " page ", rel,
                       " of order ", order, " is misaligned or past the chunk");
        }
        const uint64_t buddy = rel ^ length;
        if (order < max_order_ && buddy + length <= c.pages &&
            free_order_[c.first_page + buddy] == order) {
          return error(ErrorCode::kIllegalState, "free buddies at chunk ", chunk, " pages ", rel,
                       " and ", buddy, " (order ", order, ") were not coalesced");
        }
        ++heads_seen[chunk * orders() + order];
        free_pages += length;
        if (next_page_with(page, page + length, false) != page + length) {
          return error(ErrorCode::kIllegalState, "free block at chunk ", chunk, " page ", rel,
                       " is not marked free");
        }
      } else if (span_pages_[page] != 0) {
        length = span_pages_[page];
        if (rel + length > c.pages) {
          return error(ErrorCode::kIllegalState, "allocation at chunk ", chunk, " page ", rel,
                       " runs past the chunk");
        }
        if (next_page_with(page, page + length, true) != page + length) {
          return error(ErrorCode::kIllegalState, "allocation at chunk ", chunk, " page ", rel,
                       " is marked free");
        }
        if (span_cached_[page]) {
          cached += length;
        } else {
          allocated += length;
          requested += span_requested_[page];
          ++live;
        }
      } else {
        return error(ErrorCode::kIllegalState, "chunk ", chunk, " page ", rel,
                     " is neither free nor allocated");
      }
      for (uint64_t i = 1; i < length; ++i) {
        if (free_order_[page + i] >= 0 || span_pages_[page + i] != 0) {
          return error(ErrorCode::kIllegalState, "chunk ", chunk, " page ", rel + i,
                       " lies inside another block but heads one");
        }
      }
      rel += length;
    }
  }
  for (uint32_t chunk = 0; chunk < chunks_.size(); ++chunk) {
    for (int k = 0; k < orders(); ++k) {
      uint64_t listed = 0;
      for (uint32_t p = head(chunk, k); p != kNone; p = next_[p]) {
        if (free_order_[p] != k || page_chunk_[p] != chunk) {
          return error(ErrorCode::kIllegalState, "free list (", chunk, ", ", k, ") holds page ", p);
        }
        if (++listed > capacity_pages_) return error(ErrorCode::kIllegalState, "free list loops");
      }
      if (listed != heads_seen[chunk * orders() + k]) {
        return error(ErrorCode::kIllegalState, "free list (", chunk, ", ", k, ") has ", listed,
                     " blocks, the pool ", heads_seen[chunk * orders() + k]);
      }
      const bool bit = (nonempty_[k * nonempty_words_ + chunk / 64] >> (chunk % 64)) & 1;
      if (bit != (listed != 0)) {
        return error(ErrorCode::kIllegalState, "non-empty bit of (", chunk, ", ", k, ") is wrong");
      }
    }
  }
  if (allocated != allocated_pages_ || cached != cached_pages_ || live != live_allocations_ ||
      requested != requested_bytes_) {
    return error(ErrorCode::kIllegalState, "accounting: ", allocated, " allocated pages (counted ",
                 allocated_pages_, "), ", cached, " cached (", cached_pages_, "), ", live,
                 " live (", live_allocations_, ")");
  }
  if (free_pages + allocated + cached != capacity_pages_) {
    return error(ErrorCode::kIllegalState, free_pages, " free + ", allocated, " allocated + ",
                 cached, " cached pages != capacity ", capacity_pages_);
  }
  uint64_t cache_entries = 0;
  for (const auto& cache : shared_cache_) cache_entries += cache.size();
  uint64_t cached_spans = 0;
  for (uint64_t p = 0; p < capacity_pages_; ++p) cached_spans += span_cached_[p];
  if (cache_entries != cached_spans) {
    return error(ErrorCode::kIllegalState, "sharing cache lists ", cache_entries,
                 " blocks, the pool marks ", cached_spans);
  }
  return Status();
}

}  // namespace hiber::memory
