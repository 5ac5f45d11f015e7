// The control messages of wire/control_types.h to and from Cap'n Proto (control.capnp).
#pragma once

#include "wire/control_types.h"
#include "wire/schema/control.capnp.h"

namespace hiber::wire {

void write_control_request(proto::ControlRequest::Builder out, const control::Request& request);
// kNotSupported for a request kind newer than this build. Throws kj::Exception where the sender
// encoded a field wrongly (read_message catches it).
Result<control::Request> read_control_request(proto::ControlRequest::Reader in);

// REQUIRES: an error reply's Status is not ok.
void write_control_reply(proto::ControlReply::Builder out, const control::Reply& reply);
// kInvalidValue for a status reply, a reply kind newer than this build, or an error reply with
// code 0 (an error answer is never a success).
Result<control::Reply> read_control_reply(proto::ControlReply::Reader in);

}  // namespace hiber::wire
