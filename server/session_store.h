// What survives hiberd: the records that let a restarted hiberd resume its functions' sessions
// (docs/design.md, "Restart without loss").
//
// The store lives in hiberd's state directory (--state_dir): the model repository's files
// (repository/, server/model_repository.h) and one record per session whose model is fixed
// (sessions/, server/session_record.capnp): its function and instance, its address range and
// quota, and for each model block where its host copy lies in the files and the copy's SHA-256.
// Records are written atomically (a temporary file, fsync, rename), by a writer thread when a
// session's first request fixes its model, and removed when the session ends because its client
// went away. When hiberd itself stops or dies they stay.
//
// A restarted hiberd opens the store: it reads every record, maps the files it names read-only,
// checks every block's digest and reserves the session's address range, so no new session can
// take it. A record that fails any of that is dropped with a log line and never served, and
// repository files no valid record names are removed. A client that presents the session's
// resume token (Hello.resumeToken; the record keeps only the token's digest) claims it: the new
// session adopts the range and copies the blocks into this hiberd's repository, then saves a
// record of its own, and the old record goes, with the old files once no record needs them.
// Records nobody claims within the resume window go too (expire()).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "server/controller.h"
#include "server/device/device.h"
#include "server/function_memory.h"
#include "server/module_cache.h"

namespace hiber::server {

struct SessionStoreOptions {
  std::string directory;  // created (mode 0700) if missing
  // How long a record waits for its client after hiberd starts.
  std::chrono::milliseconds resume_window{std::chrono::minutes(10)};
};

// Who a record is of.
struct StoredSession {
  std::string function_id;
  std::string instance;
  uint64_t va_base = 0;
  uint64_t va_bytes = 0;
  uint64_t quota_bytes = 0;
  bool stateful = false;
};

// A session an earlier hiberd kept, as a claim hands it out.
struct RecoveredSession {
  StoredSession who;
  struct Block {
    uint64_t va = 0;
    std::span<const std::byte> contents;  // the old file's bytes, mapped read-only
    Sha256 digest{};
    std::string file;  // the old file's name, in the repository directory
  };
  std::vector<Block> blocks;
};

class SessionStore {
 public:
  // Opens the store in options.directory and recovers what an earlier hiberd left there,
  // reserving each recovered session's address range on `device`.
  static Result<std::unique_ptr<SessionStore>> open(device::Device& device,
                                                    const SessionStoreOptions& options);
  // Finishes the writes under way, frees the reserved ranges of sessions never claimed and
  // unmaps the old files. Records stay.
  ~SessionStore();

  SessionStore(const SessionStore&) = delete;
  SessionStore& operator=(const SessionStore&) = delete;

  // Where this hiberd's model repository keeps its files, and the prefix of their names (new for
  // every hiberd, so they never meet the files of the one before).
  std::string repository_directory() const;
  const std::string& file_prefix() const { return prefix_; }

  // Keeps the address ranges the records in `directory` name free in this process (PROT_NONE
  // mappings) until open() reserves them on the device: called before the device exists, whose
  // own mappings (the simulated GPUs' memory) would otherwise land anywhere, those ranges
  // included. Best effort: a range it cannot hold is left to open() to try.
  static void hold_recorded_ranges(const std::string& directory);

  // A token for a new session: 128 random bits, as hex.
  static Result<std::string> new_token();

  // The recovered session `token` names, for function `function_id`'s instance `instance`.
  // kNotFound when there is none (never kept, expired, or dropped at recovery), kNotPermitted
  // when it is another function's or instance's, kIllegalState for a stateful function (its
  // state lived on the GPU and is lost). The caller owns the session's address range from now
  // on (it adopts it, or frees it); the blocks' contents stay mapped until finish_claim.
  Result<std::shared_ptr<const RecoveredSession>> claim(const std::string& token,
                                                        const std::string& function_id,
                                                        const std::string& instance);
  // The claimed session was resumed or refused: its record goes, and the old files once no
  // record needs them.
  void finish_claim(const std::string& token);

  // Saves session `token`'s record now, the blocks' digests known (a resumed session's).
  Status save(const std::string& token, const StoredSession& who,
              const std::vector<FunctionMemory::KeptBlock>& blocks);
  // Saves it on the writer thread, which computes the digests (FunctionMemory::kept_model):
  // after the session's first request fixed its model.
  void save_later(const std::string& token, const StoredSession& who,
                  std::weak_ptr<FunctionMemory> memory);
  // Session `token` ended for good: its record goes (and a save not yet written is not).
  void forget(const std::string& token);
  // Drops recovered sessions unclaimed past the resume window. Returns how many.
  size_t expire();

  // ---- Registrations ----
  // The functions registered with the hiberd before (read at open), to be registered again
  // before any session resumes.
  const std::vector<Registration>& registrations() const { return registrations_; }
  void save_registration(const Registration& registration);
  void forget_registration(const std::string& function_id);

  size_t recovered() const;  // recovered and not yet claimed or expired
  uint64_t records_written() const;

  // Waits until every save_later so far is written (tests).
  void flush();

 private:
  struct OldFile {
    std::byte* data = nullptr;
    uint64_t bytes = 0;
    int references = 0;  // recovered sessions whose blocks lie in it
  };
  struct Recovered {
    std::string record_path;
    std::shared_ptr<RecoveredSession> session;
    std::vector<std::string> files;  // the old files it references (once each)
  };
  struct PendingSave {
    std::string token;
    StoredSession who;
    std::weak_ptr<FunctionMemory> memory;
  };

  SessionStore(device::Device& device, const SessionStoreOptions& options, std::string prefix);
  void recover() REQUIRES(mutex_);
  void recover_registrations();
  std::string registration_path(const std::string& function_id) const;
  // Reads and checks one record; its files are mapped into old_files_.
  Result<Recovered> recover_record(const std::string& path) REQUIRES(mutex_);
  Result<const OldFile*> map_old_file(const std::string& name) REQUIRES(mutex_);
  void release_files(const std::vector<std::string>& files) REQUIRES(mutex_);
  // `session` was resumed or dropped: its blocks' bytes in the old files are of no more use, and
  // give their memory back now (punched out of each file another session still needs).
  void punch_blocks(const RecoveredSession& session) REQUIRES(mutex_);
  void drop_recovered(const std::string& digest, bool free_range) REQUIRES(mutex_);
  std::string record_path(const std::string& token) const;
  Status write_record(const std::string& token, const StoredSession& who,
                      const std::vector<FunctionMemory::KeptBlock>& blocks) REQUIRES(mutex_);
  void writer_main();

  device::Device& device_;
  const SessionStoreOptions options_;
  const std::string prefix_;
  const std::chrono::steady_clock::time_point opened_;
  std::vector<Registration> registrations_;  // read at open

  mutable Mutex mutex_;
  std::map<std::string, OldFile> old_files_ GUARDED_BY(mutex_);    // by name
  std::map<std::string, Recovered> recovered_ GUARDED_BY(mutex_);  // by token digest (hex)
  std::map<std::string, Recovered> claimed_ GUARDED_BY(mutex_);    // by token (claimed, unfinished)
  std::set<std::string> live_ GUARDED_BY(mutex_);  // tokens whose sessions may be saved
  std::deque<PendingSave> pending_ GUARDED_BY(mutex_);
  bool writing_ GUARDED_BY(mutex_) = false;
  bool stopping_ GUARDED_BY(mutex_) = false;
  uint64_t written_ GUARDED_BY(mutex_) = 0;
  std::condition_variable wake_;  // the writer: work, or stopping
  std::condition_variable idle_;  // flush(): nothing pending
  std::thread writer_;
};

}  // namespace hiber::server
