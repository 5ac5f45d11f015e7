// One workload through the node core twice: with hiberd's actuator (the Controller, whose
// function instances keep their blocks in FunctionMemory on the simulated device, real pools,
// real swaps) and with hiber-sim's (HiberNode: the same pools, the link model, simulated time).
// The two must make the same decisions: every request on the same GPU with its model from the
// same source, the same replicas evicted, the same models resident after every step.
//
// The workload is sequential or two requests at a time, and the next request arrives only once
// the previous swaps are done, so the two clocks (wall time in hiberd, simulated time in the
// simulator) cannot order events differently; eviction is LRU, whose order does not depend on
// how long things took. Models are equal-sized blocks, so a pool places them alike whatever
// order each side allocates them in.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/controller.h"
#include "server/device/sim_device.h"
#include "server/function_memory.h"
#include "sim/event_queue.h"
#include "sim/hiber_node.h"
#include "sim/metrics.h"
#include "sim/models.h"

namespace hiber {
namespace {

using scheduler::Source;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBlock = 4 * kMiB;
constexpr uint64_t kGpuMemory = 160 * kMiB;
constexpr uint64_t kReserve = 32 * kMiB;  // 128 MiB pools
constexpr int kGpus = 2;
constexpr scheduler::Duration kMs = scheduler::kMillisecond;

// Model sizes in blocks: 320 MiB of models for 256 MiB of pools, so models are evicted.
const std::vector<int> kModelBlocks = {12, 10, 16, 8, 20, 14};
constexpr int kScratchBlocks = 2;

// GPUs 0 and 1 of the Torpor node (one PCIe switch, one NVLink), with small memories.
NodeConfig node_config() {
  NodeConfig c = paper_node_config();  // the topology these cases were written for
  c.gpus.resize(kGpus);
  for (GpuSpec& g : c.gpus) g.memory_bytes = kGpuMemory;
  std::erase_if(c.nvlinks,
                [](const NvLinkSpec& l) { return l.gpu_a >= kGpus || l.gpu_b >= kGpus; });
  return c;
}

// What a step observed of one request.
struct Placement {
  int gpu = -1;
  std::string source;  // scheduler::source_name()
  friend bool operator==(const Placement&, const Placement&) = default;
};

// After each step: the GPUs holding each function's model, and the node's counters.
struct Snapshot {
  std::vector<std::set<int>> resident;
  uint64_t evictions = 0, host_swaps = 0, peer_swaps = 0, resident_starts = 0, completed = 0;
  friend bool operator==(const Snapshot&, const Snapshot&) = default;
};

std::ostream& operator<<(std::ostream& out, const Placement& p) {
  return out << "GPU " << p.gpu << " from " << p.source;
}
std::ostream& operator<<(std::ostream& out, const Snapshot& s) {
  out << "{resident:";
  for (const auto& gpus : s.resident) {
    out << " [";
    for (int g : gpus) out << g;
    out << "]";
  }
  return out << ", evictions " << s.evictions << ", host " << s.host_swaps << ", peer "
             << s.peer_swaps << ", resident " << s.resident_starts << ", completed " << s.completed
             << "}";
}

// The workload: each step runs one or two functions' requests at once.
std::vector<std::vector<int>> workload() {
  std::vector<std::vector<int>> steps;
  uint32_t x = 12345;
  auto next = [&] {
    x = x * 1103515245 + 12345;
    return static_cast<int>((x >> 16) % kModelBlocks.size());
  };
  for (int i = 0; i < 40; ++i) {
    const int a = next();
    if (i % 3 == 2) {
      int b = next();
      if (b == a) b = (a + 1) % static_cast<int>(kModelBlocks.size());
      steps.push_back({a, b});
    } else {
      steps.push_back({a});
    }
  }
  return steps;
}

// ---------------------------------------------------------------------------------------------
// hiberd's side: the Controller, with instances that do what a session does with a lease.

class Instance final : public server::LeaseHolder {
 public:
  Instance(SessionId id, InstanceId instance, std::string name, device::Device& device,
           server::GpuLessor& lessor, std::shared_ptr<server::FunctionMemory> memory)
      : id_(id),
        instance_(instance),
        name_(std::move(name)),
        device_(device),
        lessor_(lessor),
        memory_(std::move(memory)),
        next_va_(memory_->va_base()) {
    thread_ = std::thread([this] { run(); });
  }
  ~Instance() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
    for (auto& s : streams_) {
      if (s) (void)device_.destroy_stream(*s);
    }
  }

  SessionId id() const override { return id_; }
  InstanceId instance() const override { return instance_; }
  const std::string& function_id() const override { return name_; }
  const std::string& instance_key() const override { return instance_key_; }
  const std::shared_ptr<server::FunctionMemory>& memory() const override { return memory_; }
  void grant(const server::Lease& lease) override { post({lease, std::nullopt, Status()}); }
  void end_lease(RequestId lease) override { post({std::nullopt, lease, Status()}); }
  void fail(RequestId lease, const Status& why) override { post({std::nullopt, lease, why}); }
  // These instances run no kernels, so nothing faults and no shared context is ever reset
  // under them; the controller only needs the answer.
  void forget_shared_context(GpuId gpu) override { lessor_.context_forgotten(id_, gpu); }

  // Start-up, as a function's process does it: allocate the model's blocks, then write them,
  // which needs a GPU (a background lease, given back once the writes are done).
  void start_up(int blocks) {
    for (int i = 0; i < blocks; ++i) {
      ASSERT_TRUE(memory_->add_block(next_va_, kBlock, std::nullopt, {}).ok());
      model_.push_back(next_va_);
      next_va_ += kBlock;
    }
    lessor_.need_gpu(id_);
    wait([&] { return startups_done_ > 0; });
  }
  void wait_swap_done(RequestId lease) {
    wait([&] { return swaps_done_.count(lease) != 0; });
  }
  void wait_released(RequestId lease) {
    wait([&] { return released_.count(lease) != 0; });
  }
  Status failure() {
    std::lock_guard lock(mutex_);
    return failure_;
  }

 private:
  struct Command {
    std::optional<server::Lease> grant;
    std::optional<RequestId> end;
    Status why;
  };

  void post(Command c) {
    {
      std::lock_guard lock(mutex_);
      commands_.push_back(std::move(c));
    }
    changed_.notify_all();
  }
  template <typename Pred>
  void wait(Pred pred) {
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(changed_.wait_for(lock, std::chrono::seconds(30), pred))
        << name_ << ": timed out; failure: " << failure_;
  }
  void note_failure(const Status& s) {
    if (s.ok()) return;
    std::lock_guard lock(mutex_);
    if (failure_.ok()) failure_ = s;
  }

  void run() {
    while (true) {
      Command c;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !commands_.empty(); });
        if (stopping_) return;
        c = std::move(commands_.front());
        commands_.pop_front();
      }
      if (c.grant) {
        begin(*c.grant);
      } else if (lease_ && lease_->id == *c.end) {
        finish(c.why);
      }
    }
  }

  void begin(const server::Lease& lease) {
    const GpuId gpu = lease.gpus.first();
    auto& stream = streams_[gpu.value()];
    if (!stream) stream = *device_.create_stream(gpu.value(), 0);
    const RequestId id = lease.id;
    Status bound = memory_->bind(
        lease, *stream,
        [this, id](const Status& done, const server::SwapReport& report) {
          lessor_.swap_done(id_, id, done, report);
          note_failure(done);
          {
            std::lock_guard lock(mutex_);
            swaps_done_.insert(id);
          }
          changed_.notify_all();
        },
        [this](GpuId g, const memory::Shortfall& s) { return lessor_.make_room(id_, g, s); });
    lessor_.streaming(id_, lease.id, bound, bound.ok() && memory_->bound_swap_bytes() == 0);
    note_failure(bound);
    lease_ = lease;
    if (!bound.ok()) {
      finish(bound);
      return;
    }
    if (lease.implicit) {
      // The start-up writes its model, then gives the GPU back.
      std::vector<std::byte> data(kBlock, std::byte{0x5a});
      std::vector<device::Event> waits;
      for (uint64_t va : model_) {
        memory_->access(va, kBlock, /*write=*/true, &waits);
        note_failure(device_.copy_host_to_device(*stream, va, data.data(), kBlock));
      }
      note_failure(device_.synchronize_stream(*stream));
      finish(Status());
      {
        std::lock_guard lock(mutex_);
        ++startups_done_;
      }
      changed_.notify_all();
      return;
    }
    // A request: its activations and workspace, placed at once on the lease's GPU, at the same
    // addresses every time (past the model).
    for (int i = 0; i < kScratchBlocks; ++i) {
      const uint64_t va = next_va_ + i * kBlock;
      Status placed = memory_->add_block(
          va, kBlock, lease.gpus.first(),
          [this](GpuId g, const memory::Shortfall& s) { return lessor_.make_room(id_, g, s); });
      note_failure(placed);
      if (placed.ok()) scratch_.push_back(va);
    }
  }

  void finish(const Status& why) {
    const server::Lease lease = *lease_;
    wait_swap_done(lease.id);
    for (uint64_t va : scratch_) note_failure(memory_->remove_block(va));
    scratch_.clear();
    note_failure(memory_->unbind());
    lease_.reset();
    lessor_.released(id_, lease.id, why);
    {
      std::lock_guard lock(mutex_);
      released_.insert(lease.id);
    }
    changed_.notify_all();
  }

  const SessionId id_;
  const InstanceId instance_;
  const std::string name_;
  const std::string instance_key_;  // none
  device::Device& device_;
  server::GpuLessor& lessor_;
  const std::shared_ptr<server::FunctionMemory> memory_;
  uint64_t next_va_;
  std::vector<uint64_t> model_;
  std::vector<uint64_t> scratch_;
  std::optional<server::Lease> lease_;
  std::optional<device::Stream> streams_[kGpus];

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Command> commands_;
  std::set<RequestId> swaps_done_;
  std::set<RequestId> released_;
  int startups_done_ = 0;
  Status failure_;
  bool stopping_ = false;
  std::thread thread_;
};

template <typename T>
T wait_reply(std::function<void(server::Controller::Reply<T>)> ask) {
  auto promise = std::make_shared<std::promise<Result<T>>>();
  auto future = promise->get_future();
  ask([promise](Result<T> r) { promise->set_value(std::move(r)); });
  Result<T> r = future.get();
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : T{};
}

class HiberdSide {
 public:
  void run(const std::vector<std::vector<int>>& steps, std::vector<Placement>* placements,
           std::vector<Snapshot>* snapshots) {
    device::SimDeviceOptions device_options;
    device_options.node = node_config();
    auto device = device::SimDevice::create(device_options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    server::ControllerOptions options;
    options.scheduler.eviction = "lru";
    options.pools.reserve_bytes = kReserve;
    options.pools.chunk_bytes = kGpuMemory - kReserve;
    options.repository = {64 * kMiB, 1024 * kMiB, true};
    options.swap_group_bytes = kBlock;
    auto controller = server::Controller::create(*device_, options);
    ASSERT_TRUE(controller.ok()) << controller.status();
    controller_ = std::move(*controller);

    for (size_t f = 0; f < kModelBlocks.size(); ++f) {
      server::Registration r;
      r.function_id = str_cat("fn", f);
      r.slo = 10 * scheduler::kSecond;
      r.exec_hint = 400 * kMs;
      wait_reply<server::Controller::Ok>(
          [&](auto reply) { controller_->register_function(r, std::move(reply)); });
      const SessionId session{f + 1};
      auto plan = controller_->admit(r.function_id, "", 0, session);
      ASSERT_TRUE(plan.ok()) << plan.status();
      auto memory = server::FunctionMemory::create(
          *device_, controller_->pools(), controller_->repository(),
          memory::FunctionId{plan->instance.value()}, 256 * kMiB, plan->quota_bytes, plan->memory);
      ASSERT_TRUE(memory.ok()) << memory.status();
      instances_.push_back(std::make_unique<Instance>(session, plan->instance, r.function_id,
                                                      *device_, *controller_, std::move(*memory)));
      controller_->attach(instances_.back().get());
      instances_.back()->start_up(kModelBlocks[f]);
      snapshots->push_back(snapshot());
    }
    for (const std::vector<int>& step : steps) {
      std::vector<uint64_t> requests;
      for (int f : step) {
        const std::string name = str_cat("fn", f);
        const uint64_t id = wait_reply<uint64_t>(
            [&](auto reply) { controller_->request_arrived(name, "", std::move(reply)); });
        const wire::Started answer = wait_reply<wire::Started>(
            [&](auto reply) { controller_->request_start(id, std::move(reply)); });
        placements->push_back({answer.gpu, answer.source});
        instances_[f]->wait_swap_done(RequestId{id});
        requests.push_back(id);
      }
      for (size_t i = 0; i < step.size(); ++i) {
        wait_reply<server::Controller::Ok>(
            [&](auto reply) { controller_->request_done(requests[i], false, std::move(reply)); });
        instances_[step[i]]->wait_released(RequestId{requests[i]});
      }
      snapshots->push_back(snapshot());
    }
    for (auto& instance : instances_) {
      EXPECT_TRUE(instance->failure().ok())
          << instance->function_id() << ": " << instance->failure();
      controller_->detach(instance->id());
    }
    instances_.clear();
    controller_.reset();
  }

 private:
  Snapshot snapshot() {
    const server::ControllerStatus status = wait_reply<server::ControllerStatus>(
        [&](auto reply) { controller_->status(std::move(reply)); });
    Snapshot s;
    s.resident.resize(kModelBlocks.size());
    for (const auto& f : status.functions) {
      const int index = std::stoi(f.function_id.substr(2));
      s.resident[index] = std::set<int>(f.resident_gpus.begin(), f.resident_gpus.end());
    }
    s.evictions = status.counters.evictions;
    s.host_swaps = status.counters.host_swaps;
    s.peer_swaps = status.counters.peer_swaps;
    s.resident_starts = status.counters.resident_starts;
    s.completed = status.counters.completed;
    return s;
  }

  std::unique_ptr<device::SimDevice> device_;
  std::unique_ptr<server::Controller> controller_;
  std::vector<std::unique_ptr<Instance>> instances_;
};

// ---------------------------------------------------------------------------------------------
// hiber-sim's side.

class SimSide {
 public:
  void run(const std::vector<std::vector<int>>& steps, std::vector<Placement>* placements,
           std::vector<Snapshot>* snapshots) {
    for (size_t f = 0; f < kModelBlocks.size(); ++f) {
      sim::Model m;
      m.name = str_cat("model", f);
      m.exec = 400 * kMs;
      m.native_exec = m.exec;
      m.segments.assign(kModelBlocks[f], kBlock);
      m.model_bytes = kModelBlocks[f] * kBlock;
      m.scratch_segments.assign(kScratchBlocks, kBlock);
      m.scratch_bytes = kScratchBlocks * kBlock;
      models_.push_back(m);
      workload_.functions.push_back({str_cat("fn", f), 0, 1, 10 * scheduler::kSecond, 0.98});
    }
    workload_.duration = 1000 * scheduler::kSecond;
    const NodeConfig config = node_config();
    recorder_ = std::make_unique<sim::Recorder>(workload_, 0, 1, kGpus);
    sim::HiberOptions options;
    options.scheduler.eviction = "lru";
    options.gpu_reserve_bytes = kReserve;
    options.pool_chunk_bytes = kGpuMemory - kReserve;
    options.start_up = true;
    options.check_invariants = true;
    auto node = sim::HiberNode::create(config, options, &queue_, recorder_.get(), 0);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);

    sim::Time t = 0;
    for (uint32_t f = 0; f < kModelBlocks.size(); ++f) {
      run_until(t);
      ASSERT_TRUE(node_->add_function(f, workload_.functions[f], models_[f], t).ok());
      t += scheduler::kSecond;
      run_until(t);
      snapshots->push_back(snapshot());
    }
    for (const std::vector<int>& step : steps) {
      for (int f : step) {
        const scheduler::SchedulerCounters before = node_->scheduler().counters();
        run_until(t);
        node_->arrive(static_cast<uint32_t>(f), t);
        t += 100 * kMs;  // the swap is done, the request still runs
        run_until(t);
        placements->push_back(placement_of(f, before));
      }
      t += scheduler::kSecond;  // every request of the step finishes, in arrival order
      run_until(t);
      snapshots->push_back(snapshot());
    }
    node_->finish(t);
  }

 private:
  void run_until(sim::Time t) {
    while (!queue_.empty() && queue_.next_time() <= t) queue_.run_next();
    queue_.advance_to(t);
  }
  Placement placement_of(int f, const scheduler::SchedulerCounters& before) {
    const scheduler::Scheduler& s = node_->scheduler();
    Placement p;
    for (int g = 0; g < kGpus; ++g) {
      const scheduler::GpuState& gpu = s.node().gpu(g);
      if (gpu.running_function &&
          s.functions().id(*gpu.running_function) == FunctionId{static_cast<uint32_t>(f + 1)}) {
        p.gpu = g;
      }
    }
    const scheduler::SchedulerCounters& now = s.counters();
    p.source = scheduler::source_name(now.host_swaps > before.host_swaps   ? Source::kHost
                                      : now.peer_swaps > before.peer_swaps ? Source::kPeer
                                                                           : Source::kResident);
    return p;
  }
  Snapshot snapshot() {
    const scheduler::Scheduler& s = node_->scheduler();
    Snapshot out;
    out.resident.resize(kModelBlocks.size());
    for (size_t f = 0; f < kModelBlocks.size(); ++f) {
      const auto index = s.functions().find(FunctionId{static_cast<uint32_t>(f + 1)});
      const scheduler::GpuMask holders = index ? s.node().holders(*index) : 0;
      for (int g = 0; g < kGpus; ++g) {
        if (holders & scheduler::gpu_bit(g)) out.resident[f].insert(g);
      }
    }
    const scheduler::SchedulerCounters& c = s.counters();
    out.evictions = c.evictions;
    out.host_swaps = c.host_swaps;
    out.peer_swaps = c.peer_swaps;
    out.resident_starts = c.resident_starts;
    out.completed = c.completed;
    return out;
  }

  std::vector<sim::Model> models_;
  sim::Workload workload_;
  sim::EventQueue queue_;
  std::unique_ptr<sim::Recorder> recorder_;
  std::unique_ptr<sim::HiberNode> node_;
};

// hiberd refuses prewarming at start: its controller loads models only into a session's lease.
TEST(NodeCoreActuators, HiberdRefusesPrewarming) {
  device::SimDeviceOptions device_options;
  device_options.node = node_config();
  auto device = device::SimDevice::create(device_options);
  ASSERT_TRUE(device.ok()) << device.status();
  server::ControllerOptions options;
  options.pools.reserve_bytes = kReserve;
  options.pools.chunk_bytes = kGpuMemory - kReserve;
  options.scheduler.prewarm = scheduler::PrewarmRule::kHistogram;
  auto controller = server::Controller::create(**device, options);
  ASSERT_FALSE(controller.ok());
  EXPECT_EQ(controller.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(controller.status().message().find("prewarm"), std::string::npos)
      << controller.status();
  options.scheduler.prewarm = scheduler::PrewarmRule::kNone;
  EXPECT_TRUE(server::Controller::create(**device, options).ok());
}

TEST(NodeCoreActuators, HiberdAndTheSimulatorMakeTheSameDecisions) {
  const std::vector<std::vector<int>> steps = workload();
  std::vector<Placement> hiberd_placements, sim_placements;
  std::vector<Snapshot> hiberd_snapshots, sim_snapshots;
  SimSide().run(steps, &sim_placements, &sim_snapshots);
  HiberdSide().run(steps, &hiberd_placements, &hiberd_snapshots);

  ASSERT_EQ(sim_placements.size(), hiberd_placements.size());
  for (size_t i = 0; i < sim_placements.size(); ++i) {
    EXPECT_EQ(sim_placements[i], hiberd_placements[i]) << "request " << i;
  }
  ASSERT_EQ(sim_snapshots.size(), hiberd_snapshots.size());
  for (size_t i = 0; i < sim_snapshots.size(); ++i) {
    EXPECT_EQ(sim_snapshots[i], hiberd_snapshots[i]) << "after step " << i;
  }
  // The workload is worth comparing: models were evicted and swapped in both ways.
  const Snapshot& last = sim_snapshots.back();
  EXPECT_GT(last.evictions, 5u) << last;
  EXPECT_GT(last.host_swaps, 5u) << last;
  EXPECT_GT(last.resident_starts, 5u) << last;
}

}  // namespace
}  // namespace hiber

namespace hiber {
namespace {

// hiberd runs the node core unchanged, but not with spatial sharing: its leases are exclusive
// per GPU because they are what isolates functions (docs/hiberd.md, "Spatial sharing").
TEST(NodeCoreActuators, HiberdRefusesSpatialSharingAndSaysWhy) {
  device::SimDeviceOptions device_options;
  device_options.node = node_config();
  auto device = device::SimDevice::create(device_options);
  ASSERT_TRUE(device.ok()) << device.status();
  server::ControllerOptions options;
  options.scheduler.sharing = "usher";
  options.swap_group_bytes = kBlock;
  auto controller = server::Controller::create(**device, options);
  ASSERT_FALSE(controller.ok());
  EXPECT_EQ(controller.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(controller.status().message().find("one function at a time"), std::string::npos)
      << controller.status();
  EXPECT_NE(controller.status().message().find("context per function"), std::string::npos)
      << controller.status();
}

}  // namespace
}  // namespace hiber
