// Strong id types: a number that names one kind of thing (a function, a request, a GPU, a
// session, ...). Two kinds never convert into each other or into their number, so passing a
// session id where a function id is expected does not compile. "No such thing" is
// std::optional<Id>, never a reserved number.
//
//   struct FunctionTag;
//   using FunctionId = StrongId<FunctionTag, uint32_t>;
//   FunctionId f{7};          // explicit construction only
//   f.value();                // the number, for wire formats, logs and dense indexes
#pragma once

#include <compare>
#include <cstddef>
#include <functional>
#include <ostream>
#include <type_traits>

namespace hiber {

template <typename Tag, typename Rep>
class StrongId {
  static_assert(std::is_integral_v<Rep>);

 public:
  using rep = Rep;

  constexpr explicit StrongId(Rep value) : value_(value) {}

  constexpr Rep value() const { return value_; }

  friend constexpr bool operator==(StrongId, StrongId) = default;
  friend constexpr auto operator<=>(StrongId, StrongId) = default;
  friend std::ostream& operator<<(std::ostream& out, StrongId id) {
    // Promotes 8-bit reps so that they print as numbers.
    return out << +id.value_;
  }

 private:
  Rep value_;
};

}  // namespace hiber

template <typename Tag, typename Rep>
struct std::hash<hiber::StrongId<Tag, Rep>> {
  size_t operator()(hiber::StrongId<Tag, Rep> id) const noexcept {
    return std::hash<Rep>{}(id.value());
  }
};
