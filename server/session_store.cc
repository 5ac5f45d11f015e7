#include "server/session_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <glog/logging.h>
#include <kj/array.h>

#include "common/token.h"
#include "common/unique_fd.h"
#include "server/host_pages.h"
#include "server/session_record.capnp.h"

namespace hiber::server {
namespace {

constexpr uint32_t kRecordVersion = 1;
constexpr const char* kRecordSuffix = ".record";
// A record is small (a few dozen bytes per block); anything larger is not one of ours.
constexpr uint64_t kMaxRecordBytes = 64ull << 20;

std::string sessions_dir(const std::string& root) { return root + "/sessions"; }
std::string repository_dir(const std::string& root) { return root + "/repository"; }
std::string registrations_dir(const std::string& root) { return root + "/registrations"; }
constexpr const char* kRegistrationSuffix = ".registration";

std::string hex_digest_of(std::string_view text) {
  return to_hex(sha256(std::as_bytes(std::span(text.data(), text.size()))));
}

Status os_error(const std::string& what) {
  return error(ErrorCode::kOperatingSystem, what, ": ", std::strerror(errno));
}

Status make_private_dir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return error(ErrorCode::kOperatingSystem, "creating ", path, ": ", ec.message());
  if (::chmod(path.c_str(), 0700) != 0) return os_error("chmod " + path);
  return Status();
}

// A file name the store made: no directory part, nothing hidden.
bool plain_name(std::string_view name) {
  return !name.empty() && name.size() < 256 && name.find('/') == std::string_view::npos &&
         name.front() != '.';
}

Result<std::vector<capnp::word>> read_words(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error("opening " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const Status s = os_error("stat " + path);
    ::close(fd);
    return s;
  }
  const auto bytes = static_cast<uint64_t>(st.st_size);
  if (bytes == 0 || bytes % sizeof(capnp::word) != 0 || bytes > kMaxRecordBytes) {
    ::close(fd);
    return error(ErrorCode::kInvalidValue, path, ": ", bytes, " bytes is not a record");
  }
  std::vector<capnp::word> words(bytes / sizeof(capnp::word));
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::read(fd, reinterpret_cast<char*>(words.data()) + done, bytes - done);
    if (n <= 0) {
      const Status s = n < 0 ? os_error("reading " + path)
                             : error(ErrorCode::kInvalidValue, path, ": shorter than it was");
      ::close(fd);
      return s;
    }
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return words;
}

Status write_file_atomically(const std::string& path, std::span<const std::byte> bytes) {
  const std::string temporary = path + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return os_error("creating " + temporary);
  uint64_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      const Status s = os_error("writing " + temporary);
      ::close(fd);
      ::unlink(temporary.c_str());
      return s;
    }
    done += static_cast<uint64_t>(n);
  }
  // The rename below must not make a partial record visible after a power cut.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const Status s = os_error("syncing " + temporary);
    ::unlink(temporary.c_str());
    return s;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const Status s = os_error("renaming " + temporary);
    ::unlink(temporary.c_str());
    return s;
  }
  return Status();
}

// Ranges hold_recorded_ranges() keeps, until recover() hands each to the device.
std::mutex held_mutex;
std::map<uint64_t, uint64_t>& held_ranges() {
  static auto* held = new std::map<uint64_t, uint64_t>();
  return *held;
}

void release_held(uint64_t va) {
  std::lock_guard lock(held_mutex);
  auto it = held_ranges().find(va);
  if (it == held_ranges().end()) return;
  ::munmap(reinterpret_cast<void*>(it->first), it->second);
  held_ranges().erase(it);
}

void release_all_held() {
  std::lock_guard lock(held_mutex);
  for (const auto& [va, bytes] : held_ranges()) ::munmap(reinterpret_cast<void*>(va), bytes);
  held_ranges().clear();
}

}  // namespace

void SessionStore::hold_recorded_ranges(const std::string& directory) {
  std::error_code ec;
  std::lock_guard lock(held_mutex);
  for (const auto& entry : std::filesystem::directory_iterator(sessions_dir(directory), ec)) {
    if (!entry.path().string().ends_with(kRecordSuffix)) continue;
    Result<std::vector<capnp::word>> words = read_words(entry.path().string());
    if (!words.ok()) continue;
    try {
      capnp::FlatArrayMessageReader reader(kj::arrayPtr(words->data(), words->size()));
      auto record = reader.getRoot<proto::SessionRecord>();
      const uint64_t va = record.getVaBase(), bytes = record.getVaBytes();
      if (bytes == 0 || va > UINT64_MAX - bytes || held_ranges().count(va) != 0) continue;
      void* got = ::mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
      if (got == reinterpret_cast<void*>(va)) {
        held_ranges().emplace(va, bytes);
      } else if (got != MAP_FAILED) {
        ::munmap(got, bytes);
      }
    } catch (const kj::Exception&) {
      // open() drops it, saying why.
    }
  }
}

Result<std::string> SessionStore::new_token() { return random_hex(16); }

Result<std::unique_ptr<SessionStore>> SessionStore::open(device::Device& device,
                                                         const SessionStoreOptions& options) {
  if (options.directory.empty()) {
    return Status(ErrorCode::kInvalidValue, "the session store needs a directory");
  }
  HIBER_RETURN_IF_ERROR(make_private_dir(options.directory));
  HIBER_RETURN_IF_ERROR(make_private_dir(sessions_dir(options.directory)));
  HIBER_RETURN_IF_ERROR(make_private_dir(repository_dir(options.directory)));
  HIBER_RETURN_IF_ERROR(make_private_dir(registrations_dir(options.directory)));
  // A new prefix for this hiberd's repository files, unlike every name there now.
  HIBER_ASSIGN_OR_RETURN(std::string prefix, random_hex(4));
  std::unique_ptr<SessionStore> store(new SessionStore(device, options, "h" + prefix));
  {
    MutexLock lock(store->mutex_);
    store->recover();
  }
  store->recover_registrations();
  store->writer_ = std::thread([s = store.get()] { s->writer_main(); });
  return store;
}

SessionStore::SessionStore(device::Device& device, const SessionStoreOptions& options,
                           std::string prefix)
    : device_(device),
      options_(options),
      prefix_(std::move(prefix)),
      opened_(std::chrono::steady_clock::now()) {}

SessionStore::~SessionStore() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
  MutexLock lock(mutex_);
  for (const auto& [digest, recovered] : recovered_) {
    const StoredSession& who = recovered.session->who;
    Status freed = device_.free_address_range(who.va_base, who.va_bytes);
    LOG_IF(ERROR, !freed.ok()) << "session store: " << freed;
  }
  recovered_.clear();
  claimed_.clear();
  for (auto& [name, file] : old_files_) ::munmap(file.data, file.bytes);
  old_files_.clear();
}

std::string SessionStore::repository_directory() const { return repository_dir(options_.directory); }

std::string SessionStore::record_path(const std::string& token) const {
  return sessions_dir(options_.directory) + "/" + hex_digest_of(token) + kRecordSuffix;
}

// ---- Recovery ----

void SessionStore::recover() {
  std::error_code ec;
  std::vector<std::string> records;
  for (const auto& entry :
       std::filesystem::directory_iterator(sessions_dir(options_.directory), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(kRecordSuffix)) {
      records.push_back(entry.path().string());
    } else {
      // A temporary file of a write that never finished.
      std::filesystem::remove(entry.path(), ec);
    }
  }
  std::sort(records.begin(), records.end());
  for (const std::string& path : records) {
    Result<Recovered> recovered = recover_record(path);
    if (!recovered.ok()) {
      LOG(WARNING) << "session store: dropping " << path << ": " << recovered.status();
      ::unlink(path.c_str());
      continue;
    }
    const StoredSession& who = recovered->session->who;
    // Its range, before any new session can take it.
    release_held(who.va_base);
    Result<device::DevicePtr> reserved = device_.reserve_address_range_at(who.va_base, who.va_bytes);
    if (!reserved.ok()) {
      LOG(WARNING) << "session store: dropping " << path << " (function '" << who.function_id
                   << "'): its address range: " << reserved.status();
      punch_blocks(*recovered->session);
      release_files(recovered->files);
      ::unlink(path.c_str());
      continue;
    }
    const std::string digest = std::filesystem::path(path).stem().string();
    LOG(INFO) << "session store: kept a session of function '" << who.function_id
              << "' (instance '" << who.instance << "', " << recovered->session->blocks.size()
              << " model blocks) for its client to resume";
    recovered_.emplace(digest, std::move(recovered).value());
  }
  release_all_held();
  // Repository files nothing recovered refers to are an earlier hiberd's and of no use.
  for (const auto& entry :
       std::filesystem::directory_iterator(repository_dir(options_.directory), ec)) {
    const std::string name = entry.path().filename().string();
    if (old_files_.count(name) == 0) std::filesystem::remove(entry.path(), ec);
  }
  for (auto it = old_files_.begin(); it != old_files_.end();) {
    if (it->second.references == 0) {
      ::munmap(it->second.data, it->second.bytes);
      ::unlink((repository_directory() + "/" + it->first).c_str());
      it = old_files_.erase(it);
    } else {
      ++it;
    }
  }
}

Result<const SessionStore::OldFile*> SessionStore::map_old_file(const std::string& name) {
  if (!plain_name(name)) {
    return error(ErrorCode::kInvalidValue, "'", name, "' is not a repository file name");
  }
  if (auto it = old_files_.find(name); it != old_files_.end()) return &it->second;
  const std::string path = repository_directory() + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error("opening " + path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    const Status s = st.st_size <= 0 ? error(ErrorCode::kInvalidValue, path, " is empty")
                                     : os_error("stat " + path);
    ::close(fd);
    return s;
  }
  void* data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (data == MAP_FAILED) return os_error("mapping " + path);
  OldFile& file = old_files_[name];
  file.data = static_cast<std::byte*>(data);
  file.bytes = static_cast<uint64_t>(st.st_size);
  return &file;
}

Result<SessionStore::Recovered> SessionStore::recover_record(const std::string& path) {
  HIBER_ASSIGN_OR_RETURN(std::vector<capnp::word> words, read_words(path));
  Recovered out;
  out.record_path = path;
  auto session = std::make_shared<RecoveredSession>();
  std::vector<std::string> files;
  // The files this record mapped are released again if it turns out bad.
  auto fail = [&](Status why) -> Status {
    release_files(files);
    return why;
  };
  try {
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = words.size() * 2;
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.data(), words.size()), limits);
    auto record = reader.getRoot<proto::SessionRecord>();
    if (record.getVersion() != kRecordVersion) {
      return error(ErrorCode::kNotSupported, "record version ", record.getVersion(),
                   "; this hiberd reads version ", kRecordVersion);
    }
    const std::string digest = std::filesystem::path(path).stem().string();
    const auto token_digest = record.getTokenSha256();
    Sha256 named{};
    if (token_digest.size() != named.size()) {
      return Status(ErrorCode::kInvalidValue, "the record's token digest is malformed");
    }
    std::memcpy(named.data(), token_digest.begin(), named.size());
    if (to_hex(named) != digest) {
      return Status(ErrorCode::kInvalidValue, "the record's name is not its token's digest");
    }
    StoredSession& who = session->who;
    who.function_id = record.getFunctionId();
    who.instance = record.getInstance();
    who.va_base = record.getVaBase();
    who.va_bytes = record.getVaBytes();
    who.quota_bytes = record.getQuotaBytes();
    who.stateful = record.getStateful();
    if (who.va_bytes == 0 || who.va_base > UINT64_MAX - who.va_bytes) {
      return Status(ErrorCode::kInvalidValue, "the record's address range is malformed");
    }
    for (const auto block : record.getBlocks()) {
      const std::string name = block.getFile();
      Result<const OldFile*> file = map_old_file(name);
      if (!file.ok()) return fail(file.status());
      if (std::find(files.begin(), files.end(), name) == files.end()) {
        files.push_back(name);
        ++old_files_[name].references;
      }
      const uint64_t offset = block.getOffset(), bytes = block.getBytes();
      if (bytes == 0 || offset > (*file)->bytes || bytes > (*file)->bytes - offset ||
          block.getVa() < who.va_base || block.getVa() - who.va_base > who.va_bytes ||
          bytes > who.va_bytes - (block.getVa() - who.va_base)) {
        return fail(error(ErrorCode::kInvalidValue, "block ", hex(block.getVa()), " of ", bytes,
                          " bytes at ", offset, " of ", name, " lies outside its file or range"));
      }
      RecoveredSession::Block restored;
      restored.va = block.getVa();
      restored.contents = std::span<const std::byte>((*file)->data + offset, bytes);
      restored.file = name;
      if (block.getSha256().size() != restored.digest.size()) {
        return fail(error(ErrorCode::kInvalidValue, "block ", hex(restored.va),
                          " has a malformed digest"));
      }
      std::memcpy(restored.digest.data(), block.getSha256().begin(), restored.digest.size());
      if (sha256(restored.contents) != restored.digest) {
        return fail(error(ErrorCode::kInvalidValue, "block ", hex(restored.va), " (", bytes,
                          " bytes in ", name, ") does not match its digest"));
      }
      session->blocks.push_back(restored);
    }
  } catch (const kj::Exception& e) {
    return fail(error(ErrorCode::kInvalidValue, "malformed record: ", e.getDescription().cStr()));
  }
  out.session = std::move(session);
  out.files = std::move(files);
  return out;
}

void SessionStore::release_files(const std::vector<std::string>& files) {
  for (const std::string& name : files) {
    auto it = old_files_.find(name);
    if (it == old_files_.end() || --it->second.references > 0) continue;
    ::munmap(it->second.data, it->second.bytes);
    ::unlink((repository_directory() + "/" + name).c_str());
    old_files_.erase(it);
  }
}

void SessionStore::punch_blocks(const RecoveredSession& session) {
  for (const RecoveredSession::Block& block : session.blocks) {
    auto it = old_files_.find(block.file);
    // A file no other session needs goes as a whole (release_files).
    if (it == old_files_.end() || it->second.references <= 1) continue;
    const uint64_t at = static_cast<uint64_t>(block.contents.data() - it->second.data);
    const PageSpan pages = whole_pages(at, block.contents.size());
    if (pages.empty()) continue;
    const std::string path = repository_directory() + "/" + block.file;
    const UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd || ::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                           static_cast<off_t>(pages.begin), static_cast<off_t>(pages.bytes())) != 0) {
      PLOG(WARNING) << "session store: " << path << " keeps a resumed block's bytes until "
                    << "no session needs the file";
    }
    (void)::madvise(it->second.data + pages.begin, pages.bytes(), MADV_DONTNEED);
  }
}

void SessionStore::drop_recovered(const std::string& digest, bool free_range) {
  auto it = recovered_.find(digest);
  if (it == recovered_.end()) return;
  if (free_range) {
    const StoredSession& who = it->second.session->who;
    Status freed = device_.free_address_range(who.va_base, who.va_bytes);
    LOG_IF(ERROR, !freed.ok()) << "session store: " << freed;
  }
  ::unlink(it->second.record_path.c_str());
  punch_blocks(*it->second.session);
  release_files(it->second.files);
  recovered_.erase(it);
}

// ---- Claims ----

Result<std::shared_ptr<const RecoveredSession>> SessionStore::claim(
    const std::string& token, const std::string& function_id, const std::string& instance) {
  MutexLock lock(mutex_);
  const std::string digest = hex_digest_of(token);
  auto it = recovered_.find(digest);
  if (it == recovered_.end()) {
    return Status(ErrorCode::kNotFound,
                  "hiberd restarted and kept no session for this resume token (it was never "
                  "kept, its model was not fixed yet, its resume window passed, or its record "
                  "failed verification)");
  }
  const StoredSession& who = it->second.session->who;
  if (who.function_id != function_id || who.instance != instance) {
    return error(ErrorCode::kNotPermitted, "the resume token is of another function or instance");
  }
  if (who.stateful) {
    // Its blocks' contents were on the GPU: resuming would hand it stale state.
    drop_recovered(digest, /*free_range=*/true);
    return error(ErrorCode::kIllegalState, "function '", function_id,
                 "' is stateful: its state lived on the GPU and was lost when hiberd restarted");
  }
  std::shared_ptr<const RecoveredSession> session = it->second.session;
  claimed_.emplace(token, std::move(it->second));
  recovered_.erase(it);
  return session;
}

void SessionStore::finish_claim(const std::string& token) {
  MutexLock lock(mutex_);
  auto it = claimed_.find(token);
  if (it == claimed_.end()) return;
  ::unlink(it->second.record_path.c_str());
  punch_blocks(*it->second.session);
  release_files(it->second.files);
  claimed_.erase(it);
}

size_t SessionStore::expire() {
  MutexLock lock(mutex_);
  if (recovered_.empty() ||
      std::chrono::steady_clock::now() - opened_ < options_.resume_window) {
    return 0;
  }
  size_t dropped = 0;
  while (!recovered_.empty()) {
    const auto& [digest, recovered] = *recovered_.begin();
    LOG(INFO) << "session store: no client resumed the session of function '"
              << recovered.session->who.function_id << "' within "
              << options_.resume_window.count() << " ms; dropping it";
    drop_recovered(digest, /*free_range=*/true);
    ++dropped;
  }
  return dropped;
}

// ---- Registrations ----

std::string SessionStore::registration_path(const std::string& function_id) const {
  return registrations_dir(options_.directory) + "/" + hex_digest_of(function_id) +
         kRegistrationSuffix;
}

void SessionStore::recover_registrations() {
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator(registrations_dir(options_.directory), ec)) {
    const std::string path = entry.path().string();
    if (!path.ends_with(kRegistrationSuffix)) {
      std::filesystem::remove(entry.path(), ec);  // a write that never finished
      continue;
    }
    Result<std::vector<capnp::word>> words = read_words(path);
    Status read = words.status();
    Registration r;
    if (read.ok()) {
      try {
        capnp::FlatArrayMessageReader reader(kj::arrayPtr(words->data(), words->size()));
        auto record = reader.getRoot<proto::RegistrationRecord>();
        if (record.getVersion() != kRecordVersion) {
          read = error(ErrorCode::kNotSupported, "version ", record.getVersion());
        }
        r.function_id = record.getFunctionId();
        r.slo = record.getSloNs();
        r.tail_percentile = record.getTailPercentile();
        r.quota_bytes = record.getQuotaBytes();
        r.stateful = record.getStateful();
        if (record.getHasHeavyHint()) r.heavy_hint = record.getHeavyHint();
        r.exec_hint = record.getExecHintNs();
      } catch (const kj::Exception& e) {
        read = error(ErrorCode::kInvalidValue, "malformed: ", e.getDescription().cStr());
      }
    }
    if (read.ok() && registration_path(r.function_id) != path) {
      read = Status(ErrorCode::kInvalidValue, "its name is not its function's");
    }
    if (!read.ok()) {
      LOG(WARNING) << "session store: dropping the registration " << path << ": " << read;
      ::unlink(path.c_str());
      continue;
    }
    registrations_.push_back(std::move(r));
  }
}

void SessionStore::save_registration(const Registration& r) {
  capnp::MallocMessageBuilder message;
  auto record = message.initRoot<proto::RegistrationRecord>();
  record.setVersion(kRecordVersion);
  record.setFunctionId(r.function_id);
  record.setSloNs(r.slo);
  record.setTailPercentile(r.tail_percentile);
  record.setQuotaBytes(r.quota_bytes);
  record.setStateful(r.stateful);
  record.setHasHeavyHint(r.heavy_hint.has_value());
  record.setHeavyHint(r.heavy_hint.value_or(false));
  record.setExecHintNs(r.exec_hint);
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  MutexLock lock(mutex_);
  Status written = write_file_atomically(
      registration_path(r.function_id),
      std::span(reinterpret_cast<const std::byte*>(bytes.begin()), bytes.size()));
  LOG_IF(ERROR, !written.ok()) << "session store: function '" << r.function_id << "': " << written
                               << " (a restarted hiberd will not know it until it is registered "
                                  "again)";
}

void SessionStore::forget_registration(const std::string& function_id) {
  MutexLock lock(mutex_);
  ::unlink(registration_path(function_id).c_str());
}

size_t SessionStore::recovered() const {
  MutexLock lock(mutex_);
  return recovered_.size();
}

uint64_t SessionStore::records_written() const {
  MutexLock lock(mutex_);
  return written_;
}

// ---- Records ----

Status SessionStore::write_record(const std::string& token, const StoredSession& who,
                                  const std::vector<FunctionMemory::KeptBlock>& blocks) {
  capnp::MallocMessageBuilder message;
  auto record = message.initRoot<proto::SessionRecord>();
  record.setVersion(kRecordVersion);
  const Sha256 token_digest = sha256(std::as_bytes(std::span(token.data(), token.size())));
  record.setTokenSha256(capnp::Data::Reader(
      reinterpret_cast<const capnp::byte*>(token_digest.data()), token_digest.size()));
  record.setFunctionId(who.function_id);
  record.setInstance(who.instance);
  record.setVaBase(who.va_base);
  record.setVaBytes(who.va_bytes);
  record.setQuotaBytes(who.quota_bytes);
  record.setStateful(who.stateful);
  record.setSavedAtUnixMs(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count()));
  auto list = record.initBlocks(static_cast<unsigned>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto out = list[static_cast<unsigned>(i)];
    const FunctionMemory::KeptBlock& block = blocks[i];
    out.setVa(block.va);
    out.setBytes(block.bytes);
    out.setFile(std::filesystem::path(block.file.path).filename().string());
    out.setOffset(block.file.offset);
    out.setSha256(capnp::Data::Reader(reinterpret_cast<const capnp::byte*>(block.digest.data()),
                                      block.digest.size()));
  }
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  const auto bytes = words.asBytes();
  HIBER_RETURN_IF_ERROR(write_file_atomically(
      record_path(token),
      std::span(reinterpret_cast<const std::byte*>(bytes.begin()), bytes.size())));
  ++written_;
  return Status();
}

Status SessionStore::save(const std::string& token, const StoredSession& who,
                          const std::vector<FunctionMemory::KeptBlock>& blocks) {
  MutexLock lock(mutex_);
  live_.insert(token);
  return write_record(token, who, blocks);
}

void SessionStore::save_later(const std::string& token, const StoredSession& who,
                              std::weak_ptr<FunctionMemory> memory) {
  {
    MutexLock lock(mutex_);
    live_.insert(token);
    pending_.push_back(PendingSave{token, who, std::move(memory)});
  }
  wake_.notify_all();
}

void SessionStore::forget(const std::string& token) {
  MutexLock lock(mutex_);
  live_.erase(token);
  std::erase_if(pending_, [&](const PendingSave& p) { return p.token == token; });
  ::unlink(record_path(token).c_str());
}

void SessionStore::flush() {
  MutexLock lock(mutex_);
  lock.wait(idle_, [this]() REQUIRES(mutex_) { return pending_.empty() && !writing_; });
}

void SessionStore::writer_main() {
  MutexLock lock(mutex_);
  while (true) {
    lock.wait(wake_, [this]() REQUIRES(mutex_) { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) break;  // stopping, and nothing left to write
    PendingSave save = std::move(pending_.front());
    pending_.pop_front();
    writing_ = true;
    std::shared_ptr<FunctionMemory> memory = save.memory.lock();
    Result<std::vector<FunctionMemory::KeptBlock>> kept =
        Status(ErrorCode::kDeinitialized, "the session ended");
    if (memory && save.who.stateful) {
      // Kept so that its client learns why it cannot resume.
      kept = std::vector<FunctionMemory::KeptBlock>();
    } else if (memory) {
      // Hashing a model takes a while: without the lock, so forget() and claims go on.
      lock.unlock();
      kept = memory->kept_model();
      memory.reset();
      lock.lock();
    }
    if (kept.ok() && live_.count(save.token) != 0) {
      Status written = write_record(save.token, save.who, *kept);
      LOG_IF(ERROR, !written.ok()) << "session store: function '" << save.who.function_id
                                   << "': " << written << " (it cannot be resumed)";
    } else if (!kept.ok() && kept.status().code() != ErrorCode::kDeinitialized) {
      LOG(WARNING) << "session store: function '" << save.who.function_id
                   << "' cannot be resumed after a restart: " << kept.status();
    }
    writing_ = false;
    idle_.notify_all();
  }
  writing_ = false;
  idle_.notify_all();
}

}  // namespace hiber::server
