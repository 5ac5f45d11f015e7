// Overloaded{lambdas...}: one callable from several lambdas, for std::visit over a variant.
#pragma once

namespace hiber {

template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace hiber
