#include "wire/control_codec.h"

#include <type_traits>

#include "common/overloaded.h"

namespace hiber::wire {
namespace {

proto::Heaviness heaviness(std::optional<bool> heavy) {
  if (!heavy) return proto::Heaviness::UNKNOWN;
  return *heavy ? proto::Heaviness::HEAVY : proto::Heaviness::LIGHT;
}

std::optional<bool> heaviness(proto::Heaviness heavy) {
  if (heavy == proto::Heaviness::UNKNOWN) return std::nullopt;
  return heavy == proto::Heaviness::HEAVY;
}

// Every byte of a Text, a NUL included: cStr() would cut an id at a NUL, so "a\0b" would act on
// function "a"; whole, it is refused as non-printable where the id is checked.
std::string whole(capnp::Text::Reader text) { return std::string(text.cStr(), text.size()); }
// And written whole, so decoding and encoding agree (std::string converts through c_str()).
capnp::Text::Reader whole(const std::string& text) { return {text.data(), text.size()}; }

}  // namespace

void write_control_request(proto::ControlRequest::Builder out, const control::Request& request) {
  auto version = out.initVersion();
  version.setMajor(request.version.major);
  version.setMinor(request.version.minor);
  if (!request.token.empty()) out.setToken(whole(request.token));
  std::visit(Overloaded{
                 [&](const control::StatusQuery& q) {
                   out.setStatus();
                   out.setStatusFunctionOffset(q.function_offset);
                   out.setStatusFunctionLimit(q.function_limit);
                 },
                 [&](const control::Ping&) { out.setPing(); },
                 [&](const FunctionRegistration& f) {
                   auto r = out.initRegisterFunction();
                   r.setFunctionId(whole(f.function_id));
                   r.setSloMs(f.slo_ms);
                   r.setTailPercentile(f.tail_percentile);
                   r.setQuotaBytes(f.quota_bytes);
                   r.setStateful(f.stateful);
                   r.setHeavyHint(heaviness(f.heavy));
                   r.setExecMsHint(f.exec_ms_hint);
                 },
                 [&](const control::UnregisterFunction& u) {
                   out.setUnregisterFunction(whole(u.function_id));
                 },
                 [&](const control::RequestArrived& a) {
                   out.setRequestArrived(whole(a.function_id));
                   if (!a.instance.empty()) out.setRequestArrivedInstance(whole(a.instance));
                 },
                 [&](const control::RequestStart& s) { out.setRequestStart(s.request_id); },
                 [&](const control::RequestBegin& b) {
                   out.setRequestBegin(whole(b.function_id));
                   if (!b.instance.empty()) out.setRequestArrivedInstance(whole(b.instance));
                 },
                 [&](const RequestDone& d) {
                   auto r = out.initRequestDone();
                   r.setRequestId(d.request_id);
                   r.setFailed(d.failed);
                 },
                 [&](const Drain& d) {
                   auto r = out.initDrain();
                   r.setGpu(d.gpu);
                   r.setResume(d.resume);
                 },
             },
             request.body);
}

Result<control::Request> read_control_request(proto::ControlRequest::Reader in) {
  control::Request request;
  request.version = {in.getVersion().getMajor(), in.getVersion().getMinor()};
  request.token = whole(in.getToken());
  switch (in.which()) {
    case proto::ControlRequest::STATUS:
      request.body =
          control::StatusQuery{in.getStatusFunctionOffset(), in.getStatusFunctionLimit()};
      return request;
    case proto::ControlRequest::PING: request.body = control::Ping{}; return request;
    case proto::ControlRequest::REGISTER_FUNCTION: {
      auto f = in.getRegisterFunction();
      request.body = FunctionRegistration{.function_id = whole(f.getFunctionId()),
                                          .slo_ms = f.getSloMs(),
                                          .tail_percentile = f.getTailPercentile(),
                                          .quota_bytes = f.getQuotaBytes(),
                                          .stateful = f.getStateful(),
                                          .heavy = heaviness(f.getHeavyHint()),
                                          .exec_ms_hint = f.getExecMsHint()};
      return request;
    }
    case proto::ControlRequest::UNREGISTER_FUNCTION:
      request.body = control::UnregisterFunction{whole(in.getUnregisterFunction())};
      return request;
    case proto::ControlRequest::REQUEST_ARRIVED:
      request.body = control::RequestArrived{whole(in.getRequestArrived()),
                                             whole(in.getRequestArrivedInstance())};
      return request;
    case proto::ControlRequest::REQUEST_START:
      request.body = control::RequestStart{in.getRequestStart()};
      return request;
    case proto::ControlRequest::REQUEST_BEGIN:
      request.body = control::RequestBegin{whole(in.getRequestBegin()),
                                           whole(in.getRequestArrivedInstance())};
      return request;
    case proto::ControlRequest::REQUEST_DONE:
      request.body =
          RequestDone{in.getRequestDone().getRequestId(), in.getRequestDone().getFailed()};
      return request;
    case proto::ControlRequest::DRAIN:
      request.body = Drain{in.getDrain().getGpu(), in.getDrain().getResume()};
      return request;
  }
  return error(ErrorCode::kNotSupported, "control request ", static_cast<unsigned>(in.which()),
               " is not known to this hiberd");
}

void write_control_reply(proto::ControlReply::Builder out, const control::Reply& reply) {
  std::visit(Overloaded{
                 [&](const control::Pong&) { out.setPong(); },
                 [&](const control::Ok&) { out.setOk(); },
                 [&](const control::Accepted& a) { out.setAccepted(a.request_id); },
                 [&](const Started& s) {
                   auto r = out.initStarted();
                   r.setGpu(static_cast<uint32_t>(s.gpu));
                   r.setSource(s.source);
                   r.setSourceGpu(s.source_gpu);
                   r.setRule(s.rule);
                   r.setQueuedMs(s.queued_ms);
                   r.setLink(s.link);
                   r.setRequestId(s.request_id);
                 },
                 [&](const Status& e) {
                   auto r = out.initError();
                   r.setCode(static_cast<uint32_t>(e.code()));
                   r.setMessage(e.message());
                 },
             },
             reply);
}

Result<control::Reply> read_control_reply(proto::ControlReply::Reader in) {
  switch (in.which()) {
    case proto::ControlReply::PONG: return control::Reply(control::Pong{});
    case proto::ControlReply::OK: return control::Reply(control::Ok{});
    case proto::ControlReply::ACCEPTED: return control::Reply(control::Accepted{in.getAccepted()});
    case proto::ControlReply::STARTED: {
      auto s = in.getStarted();
      return control::Reply(Started{.gpu = static_cast<int>(s.getGpu()),
                                    .source = s.getSource().cStr(),
                                    .source_gpu = s.getSourceGpu(),
                                    .rule = s.getRule().cStr(),
                                    .queued_ms = s.getQueuedMs(),
                                    .link = s.getLink().cStr(),
                                    .request_id = s.getRequestId()});
    }
    case proto::ControlReply::ERROR:
      // An error answer is never a success (control::Reply); code 0 would read as one.
      if (in.getError().getCode() == 0) {
        return error(ErrorCode::kInvalidValue, "a control error reply with code 0 (success): ",
                     in.getError().getMessage().cStr());
      }
      return control::Reply(
          Status(static_cast<ErrorCode>(in.getError().getCode()), in.getError().getMessage()));
    case proto::ControlReply::STATUS: break;
  }
  return error(ErrorCode::kInvalidValue, "a control reply of kind ",
               static_cast<unsigned>(in.which()), " where a short answer was expected");
}

}  // namespace hiber::wire
