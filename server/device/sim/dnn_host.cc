#include "server/device/sim/dnn_host.h"

#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "server/device/sim/dnn_kernels.h"
#include "server/device/sim_device.h"

namespace hiber::device::sim {
namespace {

namespace dnn = library_ops::dnn;

// The simulated GPU has one engine, global index 0: the host implementations (dnn_kernels.h).
// It uses no workspace, no tensor cores and does not down-convert inputs (fp32 accumulation), and
// it is deterministic, so it reports no numerical or behaviour notes.
constexpr int64_t kHostEngine = 0;
constexpr uint32_t kEngineCount = 1;

class SimDnn final : public LibraryBackend {
 public:
  explicit SimDnn(SimDevice& device) : device_(device) {}

  Status run(Stream stream, const LibraryCall& call) override {
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    using Bytes = std::span<const std::byte>;
    return library_ops::dispatch<Status, library_ops::Library::kDnn, library_ops::Kind::kCall>(
        call.op, call.args, "the simulated GPU",
        library_ops::Handlers{
            [&](OpTag<LibraryOp::kDnnDefineGraph>, Bytes bytes) {
              return define_graph(call.owner, bytes);
            },
            [&](OpTag<LibraryOp::kDnnExecute>, Bytes bytes) {
              return execute(stream, call.owner, bytes);
            },
            [&](OpTag<LibraryOp::kDnnBatchNormInference>, const dnn::BatchNormInference& op) {
              return legacy(stream, op, "cudnnBatchNormalizationForwardInference",
                            std::vector<SimDevice::Operand>{{op.x_ptr, extent(op.x)},
                                                            {op.y_ptr, extent(op.y)},
                                                            {op.scale, extent(op.bn)},
                                                            {op.bias, extent(op.bn)},
                                                            {op.mean, extent(op.bn)},
                                                            {op.variance, extent(op.bn)}},
                            batch_norm_inference);
            },
            [&](OpTag<LibraryOp::kDnnPooling>, const dnn::Pooling& op) {
              return legacy(stream, op, "cudnnPoolingForward", xy(op), pooling_forward);
            },
            [&](OpTag<LibraryOp::kDnnActivation>, const dnn::Activation& op) {
              return legacy(stream, op, "cudnnActivationForward", xy(op), activation_forward);
            },
            [&](OpTag<LibraryOp::kDnnSoftmax>, const dnn::Softmax& op) {
              return legacy(stream, op, "cudnnSoftmaxForward", xy(op), softmax_forward);
            },
            [&](OpTag<LibraryOp::kDnnAddTensor>, const dnn::AddTensor& op) {
              return legacy(stream, op, "cudnnAddTensor",
                            std::vector<SimDevice::Operand>{{op.a_ptr, extent(op.a)},
                                                            {op.c_ptr, extent(op.c)}},
                            add_tensor);
            }});
  }

  Result<std::vector<std::byte>> answer(Context, const LibraryCall& call) override {
    using library_ops::LibraryOp;
    using library_ops::OpTag;
    return library_ops::dispatch<Result<std::vector<std::byte>>, library_ops::Library::kDnn,
                                 library_ops::Kind::kQuery>(
        call.op, call.args, "the simulated GPU",
        library_ops::Handlers{[](OpTag<LibraryOp::kDnnFinalize>, std::span<const std::byte> bytes) {
          return finalize(bytes);
        }});
  }

  void release(uint64_t owner, std::optional<library_ops::LibraryHandle> handle) override {
    // Graphs belong to the session, not to a handle: they go when the session does.
    if (handle) return;
    MutexLock lock(mu_);
    graphs_.erase(owner);
  }
  // Graphs are the session's, in no context.
  void forget_context(Context) override {}

 private:
  // kDnnFinalize: the host engine, supported or not with the reason.
  static Result<std::vector<std::byte>> finalize(std::span<const std::byte> bytes) {
    HIBER_ASSIGN_OR_RETURN(dnn::Graph graph, dnn::decode_graph(bytes));
    HIBER_ASSIGN_OR_RETURN(dnn::OpGraph ops, dnn::interpret_operation_graph(graph));
    dnn::EngineSupport engine;
    engine.global_index = kHostEngine;
    Status supported = host_engine_supports(ops);
    engine.supported = supported.ok() ? 1 : 0;
    if (!supported.ok()) {
      const std::string why = supported.message();
      std::snprintf(engine.why, sizeof(engine.why), "%s", why.c_str());
    }
    std::vector<dnn::EngineSupport> engines(kEngineCount);
    engines[0] = engine;
    return dnn::encode_finalize_answer(engines);
  }

  static uint64_t extent(const dnn::TensorShape& s) {
    auto bytes = dnn::tensor_extent(dnn::as_tensor(s));
    return bytes.ok() ? *bytes : 0;
  }
  template <typename Op>
  static std::vector<SimDevice::Operand> xy(const Op& op) {
    return {{op.x_ptr, extent(op.x)}, {op.y_ptr, extent(op.y)}};
  }

  template <typename Op, typename Run>
  Status legacy(Stream stream, const Op& op, const char* name,
                std::vector<SimDevice::Operand> operands, Run run) {
    HIBER_RETURN_IF_ERROR(dnn::check_op(op));
    return device_.enqueue_host_work(stream, std::move(operands), name, [op, run] {
      run(op);
      return Status();
    });
  }

  Status define_graph(uint64_t owner, std::span<const std::byte> bytes) {
    HIBER_ASSIGN_OR_RETURN(auto defined, dnn::decode_define_graph(bytes));
    HIBER_ASSIGN_OR_RETURN(dnn::Plan plan, dnn::interpret_plan(defined.second));
    if (plan.engine != kHostEngine)
      return error(ErrorCode::kNotSupported, "cuDNN plan with engine ", plan.engine,
                   ": the simulated GPU has engine 0 only");
    HIBER_RETURN_IF_ERROR(host_engine_supports(plan.graph));
    MutexLock lock(mu_);
    auto& owned = graphs_[owner];
    owned[defined.first] = std::make_shared<const dnn::Plan>(std::move(plan));
    return Status();
  }

  Status execute(Stream stream, uint64_t owner, std::span<const std::byte> bytes) {
    HIBER_ASSIGN_OR_RETURN(dnn::Execute e, dnn::decode_execute(bytes));
    std::shared_ptr<const dnn::Plan> plan;
    {
      MutexLock lock(mu_);
      auto owned = graphs_.find(owner);
      if (owned != graphs_.end()) {
        auto it = owned->second.find(e.header.graph_id);
        if (it != owned->second.end()) plan = it->second;
      }
    }
    if (plan == nullptr)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: graph ", e.header.graph_id,
                   " is not defined on the simulated GPU");
    HIBER_ASSIGN_OR_RETURN(auto bound, dnn::bind_variant_pack(plan->graph, e));
    std::vector<SimDevice::Operand> operands;
    for (const dnn::Bound& b : bound)
      if (b.ptr != 0) operands.push_back({b.ptr, b.bytes});
    return device_.enqueue_host_work(
        stream, operands, "cudnnBackendExecute",
        [plan, bound = std::move(bound)] { return run_op_graph(plan->graph, bound); });
  }

  SimDevice& device_;
  Mutex mu_;
  // Defined graphs by owner (session) and the client's graph id.
  std::map<uint64_t, std::map<uint64_t, std::shared_ptr<const dnn::Plan>>> graphs_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<LibraryBackend> make_dnn_backend(SimDevice& device) {
  return std::make_unique<SimDnn>(device);
}

}  // namespace hiber::device::sim
