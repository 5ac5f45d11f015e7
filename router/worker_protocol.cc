#include "router/worker_protocol.h"

#include <algorithm>
#include <utility>

namespace hiber::router {
namespace {

template <typename T>
void put_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

template <typename T>
T get_le(const char* bytes) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return value;
}

// A body arrives in pieces; reserving what the peer announces up to this bound avoids most
// reallocations without letting a bad length allocate a gigabyte before any of it comes.
constexpr uint64_t kBodyReserveBytes = 16 << 20;

}  // namespace

std::string encode_worker_frame(const nlohmann::json& header, std::string_view body) {
  const std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(kWorkerPrefixBytes + text.size() + body.size());
  put_le<uint32_t>(out, static_cast<uint32_t>(text.size()));
  put_le<uint64_t>(out, body.size());
  out += text;
  out += body;
  return out;
}

size_t WorkerFrameReader::feed(std::string_view bytes) {
  if (complete_ || !error_.ok()) return 0;
  size_t used = 0;
  if (prefix_received_ < kWorkerPrefixBytes) {
    const size_t n = std::min(bytes.size(), kWorkerPrefixBytes - prefix_received_);
    std::copy_n(bytes.data(), n, prefix_ + prefix_received_);
    prefix_received_ += n;
    used += n;
    if (prefix_received_ < kWorkerPrefixBytes) return used;
    header_bytes_ = get_le<uint32_t>(prefix_);
    body_bytes_ = get_le<uint64_t>(prefix_ + 4);
    if (header_bytes_ == 0 || header_bytes_ > kMaxWorkerHeaderBytes) {
      error_ = hiber::error(ErrorCode::kInvalidValue, "worker frame header of ", header_bytes_,
                            " bytes (must be 1 to ", kMaxWorkerHeaderBytes, ")");
      return used;
    }
    if (body_bytes_ > kMaxWorkerBodyBytes) {
      error_ = hiber::error(ErrorCode::kInvalidValue, "worker frame body of ", body_bytes_,
                            " bytes (at most ", kMaxWorkerBodyBytes, ")");
      return used;
    }
    header_text_.reserve(header_bytes_);
    frame_.body.reserve(std::min(body_bytes_, kBodyReserveBytes));
  }
  if (!have_header_) {
    const size_t n = std::min(bytes.size() - used, header_bytes_ - header_text_.size());
    header_text_.append(bytes.data() + used, n);
    used += n;
    if (header_text_.size() < header_bytes_) return used;
    parse_header();
    if (!error_.ok()) return used;
  }
  const size_t n = static_cast<size_t>(
      std::min<uint64_t>(bytes.size() - used, body_bytes_ - frame_.body.size()));
  frame_.body.append(bytes.data() + used, n);
  used += n;
  complete_ = frame_.body.size() == body_bytes_;
  return used;
}

void WorkerFrameReader::parse_header() {
  frame_.header = nlohmann::json::parse(header_text_, nullptr, /*allow_exceptions=*/false);
  if (frame_.header.is_discarded()) {
    error_ = hiber::error(ErrorCode::kInvalidValue, "worker frame header is not valid JSON");
  } else if (!frame_.header.is_object()) {
    error_ =
        hiber::error(ErrorCode::kInvalidValue, "worker frame header is JSON but not an object");
  }
  have_header_ = true;
  header_text_.clear();
}

WorkerFrame WorkerFrameReader::take() {
  WorkerFrame frame = std::move(frame_);
  frame_ = WorkerFrame{};
  prefix_received_ = 0;
  header_bytes_ = 0;
  body_bytes_ = 0;
  have_header_ = false;
  complete_ = false;
  return frame;
}

}  // namespace hiber::router
