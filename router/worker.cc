#include "router/worker.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include <glog/logging.h>
#include <boost/asio/write.hpp>

extern char** environ;

namespace hiber::router {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;
using nlohmann::json;

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return str_cat("exited ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return str_cat("killed by signal ", WTERMSIG(status));
  return str_cat("ended with wait status ", status);
}

// The router's environment, then the registration's, then Hiber's variables.
std::vector<std::string> worker_environment(const FunctionSpec& spec, const WorkerLaunch& launch) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* equals = std::strchr(*e, '=');
    if (equals != nullptr) env[std::string(*e, static_cast<size_t>(equals - *e))] = equals + 1;
  }
  for (const auto& [key, value] : spec.env) env[key] = value;
  // It makes an SDK attach by itself and retry forever (docs/router.md, "Attached workers");
  // a worker the router starts connects once, to its own socket.
  env.erase("HIBER_WORKER_TOKEN_FILE");
  env["HIBER_WORKER_SOCKET"] = launch.socket_path;
  env["HIBER_FUNCTION_ID"] = spec.name;
  env["HIBER_RUN_DIR"] = launch.node_run_dir;
  env["HIBER_CONCURRENCY"] = std::to_string(spec.concurrency);
  env["HIBER_INSTANCE_ID"] = launch.instance_key;
  if (spec.shim && !launch.preload.empty()) {
    auto it = spec.env.find("LD_PRELOAD");
    env["LD_PRELOAD"] = it == spec.env.end() ? launch.preload : launch.preload + " " + it->second;
  }
  std::vector<std::string> out;
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

}  // namespace

Worker::Worker(asio::io_context& io, std::string function, WorkerLaunch launch, uint64_t instance,
               Callback on_ready, Callback on_gone)
    : io_(io),
      function_(std::move(function)),
      launch_(std::move(launch)),
      instance_(instance),
      on_ready_(std::move(on_ready)),
      on_gone_(std::move(on_gone)),
      acceptor_(io),
      socket_(io),
      kill_timer_(io) {}

Worker::~Worker() {
  *alive_ = false;
  if (pid_ > 0 && !process_gone_) ::kill(pid_, SIGKILL);  // the router is going away
  if (!attached_) ::unlink(launch_.socket_path.c_str());
}

std::unique_ptr<Worker> Worker::attach(asio::io_context& io, std::string function,
                                       asio::generic::stream_protocol::socket socket,
                                       std::string peer, uint64_t instance,
                                       std::string instance_key,
                                       std::chrono::milliseconds stop_timeout, Callback on_gone) {
  WorkerLaunch launch;
  launch.stop_timeout = stop_timeout;
  launch.instance_key = std::move(instance_key);
  std::unique_ptr<Worker> worker(new Worker(io, std::move(function), std::move(launch), instance,
                                            nullptr, std::move(on_gone)));
  worker->attached_ = true;
  worker->peer_ = std::move(peer);
  worker->socket_ = std::move(socket);
  worker->process_gone_ = true;  // no process of the router's: the connection is the worker
  worker->connection_open_ = true;
  worker->ready_ = true;
  LOG(INFO) << "worker " << worker->function_ << "#" << instance << " attached from "
            << worker->peer_;
  worker->read();
  return worker;
}

Result<std::unique_ptr<Worker>> Worker::spawn(asio::io_context& io, const FunctionSpec& spec,
                                              WorkerLaunch launch, uint64_t instance,
                                              Callback on_ready, Callback on_gone) {
  std::unique_ptr<Worker> worker(new Worker(io, spec.name, std::move(launch), instance,
                                            std::move(on_ready), std::move(on_gone)));
  const WorkerLaunch& l = worker->launch_;
  ::unlink(l.socket_path.c_str());
  error_code ec;
  asio::local::stream_protocol::endpoint endpoint(l.socket_path);
  worker->acceptor_.open(endpoint.protocol(), ec);
  if (!ec) worker->acceptor_.bind(endpoint, ec);
  if (!ec) worker->acceptor_.listen(1, ec);
  if (ec) {
    return error(ErrorCode::kOperatingSystem, "worker socket ", l.socket_path, ": ", ec.message());
  }

  const int log = ::open(l.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (log < 0) return os_error("open " + l.log_path);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log, STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // Its own process group, so that stopping it reaches whatever it started; default signals.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setsigdefault(&attributes, &all);
  posix_spawnattr_setpgroup(&attributes, 0);
  posix_spawnattr_setflags(&attributes,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<std::string> env = worker_environment(spec, l);
  std::vector<char*> argv, envp;
  for (const std::string& arg : spec.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  for (const std::string& var : env) envp.push_back(const_cast<char*>(var.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc =
      ::posix_spawn(&pid, l.program.c_str(), &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(log);
  if (rc != 0) {
    return error(ErrorCode::kOperatingSystem, "cannot start worker \"", spec.command[0], "\" of ",
                 spec.name, ": ", std::strerror(rc));
  }
  worker->pid_ = pid;
  LOG(INFO) << "worker " << spec.name << "#" << instance << " started: pid " << pid;
  worker->accept();
  return worker;
}

void Worker::accept() {
  acceptor_.async_accept(socket_, [this, alive = std::weak_ptr<bool>(alive_)](error_code ec) {
    if (alive.expired()) return;
    error_code ignored;
    acceptor_.close(ignored);  // one connection per worker
    ::unlink(launch_.socket_path.c_str());
    if (ec) {
      if (ec != asio::error::operation_aborted) LOG(WARNING) << "worker accept: " << ec.message();
      return;
    }
    connection_open_ = true;
    read();
  });
}

void Worker::read() {
  socket_.async_read_some(asio::buffer(read_buffer_), [this, alive = std::weak_ptr<bool>(alive_)](
                                                          error_code ec, size_t n) {
    if (alive.expired()) return;
    if (ec) {
      lose_connection(ec == asio::error::eof ? "the worker closed its connection"
                                             : "worker connection: " + ec.message());
      return;
    }
    std::string_view bytes(read_buffer_.data(), n);
    while (!bytes.empty() || reader_.complete()) {
      bytes.remove_prefix(reader_.feed(bytes));
      if (!reader_.error().ok()) {
        lose_connection("protocol error: " + reader_.error().message());
        return;
      }
      if (!reader_.complete()) break;
      on_frame(reader_.take());
      if (alive.expired() || !connection_open_) return;
    }
    read();
  });
}

void Worker::on_frame(WorkerFrame frame) {
  const json& header = frame.header;
  const std::string type = header.value("type", "");
  if (type == "hello") {
    if (ready_) return lose_connection("protocol error: a second hello");
    if (header.value("function", function_) != function_) {
      return lose_connection("protocol error: hello names function \"" +
                             header.value("function", "") + "\"");
    }
    ready_ = true;
    idle_since_ = std::chrono::steady_clock::now();
    LOG(INFO) << "worker " << function_ << "#" << instance_ << " ready";
    if (on_ready_) on_ready_(*this);
    return;
  }
  if (type != "result" || !ready_) {
    return lose_connection("protocol error: unexpected frame of type \"" + type + "\"");
  }
  auto id = header.find("id");
  auto it = id != header.end() && id->is_string() ? pending_.find(id->get<std::string>())
                                                  : pending_.end();
  if (it == pending_.end()) {
    return lose_connection("protocol error: a result for no request in flight");
  }
  WorkerOutcome outcome;
  outcome.ok = header.value("ok", false);
  if (outcome.ok) {
    outcome.content_type = header.value("content_type", "application/octet-stream");
    outcome.body = std::move(frame.body);
    auto header_bytes = header.find("inference_header_bytes");
    if (header_bytes != header.end()) {
      if (!header_bytes->is_number_unsigned() ||
          header_bytes->get<uint64_t>() > outcome.body.size()) {
        return lose_connection("protocol error: inference_header_bytes is not a byte count " +
                               std::string("within the answer"));
      }
      outcome.inference_header_bytes = header_bytes->get<uint64_t>();
    }
  } else {
    auto why = header.find("error");
    outcome.error =
        why != header.end() && why->is_string() ? why->get<std::string>() : "the function failed";
    // Only a 4xx is the worker's to choose: anything else is its own failure.
    auto status = header.find("status");
    if (status != header.end() && status->is_number_unsigned() && status->get<uint64_t>() >= 400 &&
        status->get<uint64_t>() < 500) {
      outcome.client_error = static_cast<unsigned>(status->get<uint64_t>());
    }
  }
  ResultHandler done = std::move(it->second);
  pending_.erase(it);
  if (pending_.empty()) idle_since_ = std::chrono::steady_clock::now();
  done(std::move(outcome));
}

void Worker::invoke(WorkerRequest request, ResultHandler done) {
  json header = {{"type", "invoke"},
                 {"id", request.id},
                 {"request_id", request.request_id},
                 {"content_type", request.content_type}};
  if (request.deadline) header["deadline_ms"] = request.deadline->count();
  if (request.inference_header_bytes) {
    header["inference_header_bytes"] = *request.inference_header_bytes;
  }
  pending_.emplace(request.id, std::move(done));
  write(encode_worker_frame(header, request.body));
}

void Worker::write(std::string frame) {
  writes_.push_back(std::move(frame));
  if (!writing_) write_next();
}

void Worker::write_next() {
  if (writes_.empty() || !connection_open_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  asio::async_write(socket_, asio::buffer(writes_.front()),
                    [this, alive = std::weak_ptr<bool>(alive_)](error_code ec, size_t) {
                      if (alive.expired()) return;
                      writes_.pop_front();
                      if (ec) {
                        writing_ = false;
                        lose_connection("worker connection: " + ec.message());
                        return;
                      }
                      write_next();
                    });
}

void Worker::lose_connection(const std::string& why) {
  if (connection_open_ || acceptor_.is_open()) {
    error_code ignored;
    socket_.close(ignored);
    acceptor_.close(ignored);
  }
  const bool was_open = connection_open_;
  connection_open_ = false;
  writes_.clear();
  if (end_reason_.empty() && !stopping_) end_reason_ = why;
  if (was_open && !stopping_) {
    LOG(WARNING) << "worker " << function_ << "#" << instance_
                 << (attached_ ? " (attached from " + peer_ + ")" : std::string()) << ": " << why;
  }
  // A worker without its connection is of no more use: make sure the process goes too.
  if (pid_ > 0 && !process_gone_ && !stopping_) stop(why);
  std::map<std::string, ResultHandler> failed;
  failed.swap(pending_);
  for (auto& [id, done] : failed) {
    WorkerOutcome outcome;
    outcome.worker_lost = true;
    outcome.error = "the function's worker was lost mid-request (" + why + ")";
    done(std::move(outcome));
  }
  maybe_gone();
}

void Worker::stop(std::string why) {
  if (stopping_) return;
  stopping_ = true;
  if (end_reason_.empty()) end_reason_ = std::move(why);
  error_code ignored;
  socket_.shutdown(asio::socket_base::shutdown_send, ignored);
  acceptor_.close(ignored);
  if (pid_ > 0 && !process_gone_) ::kill(pid_, SIGTERM);
  kill_timer_.expires_after(launch_.stop_timeout);
  kill_timer_.async_wait([this, alive = std::weak_ptr<bool>(alive_)](error_code ec) {
    if (ec || alive.expired()) return;
    if (attached_) {
      if (connection_open_) lose_connection("it did not close its connection when stopped");
      return;
    }
    if (process_gone_) return;
    LOG(WARNING) << "worker " << function_ << "#" << instance_ << " ignored SIGTERM: killed";
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
  });
}

void Worker::on_exit(int wait_status) {
  process_gone_ = true;
  kill_timer_.cancel();
  const std::string how = describe_wait_status(wait_status);
  if (!stopping_) {
    LOG(WARNING) << "worker " << function_ << "#" << instance_ << " (pid " << pid_ << ") " << how;
  }
  if (end_reason_.empty() || !stopping_) end_reason_ = how;
  lose_connection("the worker process " + how);
}

void Worker::maybe_gone() {
  if (gone_reported_ || !process_gone_ || connection_open_) return;
  gone_reported_ = true;
  // Reported from the loop, so the router may destroy this worker in its callback.
  asio::post(io_, [this, alive = std::weak_ptr<bool>(alive_)] {
    if (!alive.expired() && on_gone_) on_gone_(*this);
  });
}

}  // namespace hiber::router
