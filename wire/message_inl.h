// Template part of wire/message.h.
#pragma once

#include <kj/exception.h>

namespace hiber::wire {

template <typename T, typename Fn>
Status read_message(const Message& message, std::string_view what, Fn&& fn) {
  HIBER_RETURN_IF_ERROR(check_framing(message, what));
  try {
    capnp::FlatArrayMessageReader reader(message.words(),
                                         untrusted_reader_options(message.words().size()));
    return fn(reader.getRoot<T>());
  } catch (const kj::Exception& exception) {
    return malformed(what, exception);
  }
}

}  // namespace hiber::wire
