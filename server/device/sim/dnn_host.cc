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

namespace dnn = wire::dnn;

// The simulated GPU has one engine, global index 0: the host implementations (dnn_kernels.h).
// It uses no workspace, no tensor cores and does not down-convert inputs (fp32 accumulation), and
// it is deterministic, so it reports no numerical or behaviour notes.
constexpr int64_t kHostEngine = 0;
constexpr uint32_t kEngineCount = 1;

class SimDnn final : public LibraryBackend {
 public:
  explicit SimDnn(SimDevice& device) : device_(device) {}

  Status run(Stream stream, const LibraryCall& call) override {
    switch (call.op) {
      case wire::LibraryOp::kDnnDefineGraph: return define_graph(call);
      case wire::LibraryOp::kDnnExecute: return execute(stream, call);
      case wire::LibraryOp::kDnnBatchNormInference:
        return legacy<dnn::BatchNormInference>(
            stream, call, "cudnnBatchNormalizationForwardInference",
            [](const dnn::BatchNormInference& op) {
              return std::vector<SimDevice::Operand>{
                  {op.x_ptr, extent(op.x)}, {op.y_ptr, extent(op.y)}, {op.scale, extent(op.bn)},
                  {op.bias, extent(op.bn)}, {op.mean, extent(op.bn)}, {op.variance, extent(op.bn)}};
            },
            batch_norm_inference);
      case wire::LibraryOp::kDnnPooling:
        return legacy<dnn::Pooling>(stream, call, "cudnnPoolingForward", xy<dnn::Pooling>,
                                    pooling_forward);
      case wire::LibraryOp::kDnnActivation:
        return legacy<dnn::Activation>(stream, call, "cudnnActivationForward", xy<dnn::Activation>,
                                       activation_forward);
      case wire::LibraryOp::kDnnSoftmax:
        return legacy<dnn::Softmax>(stream, call, "cudnnSoftmaxForward", xy<dnn::Softmax>,
                                    softmax_forward);
      case wire::LibraryOp::kDnnAddTensor:
        return legacy<dnn::AddTensor>(
            stream, call, "cudnnAddTensor",
            [](const dnn::AddTensor& op) {
              return std::vector<SimDevice::Operand>{{op.a_ptr, extent(op.a)},
                                                     {op.c_ptr, extent(op.c)}};
            },
            add_tensor);
      default: break;
    }
    return error(ErrorCode::kNotSupported, "cuDNN operation ", static_cast<unsigned>(call.op),
                 " has no host implementation on the simulated GPU");
  }

  Result<std::vector<std::byte>> answer(Context, const LibraryCall& call) override {
    if (call.op != wire::LibraryOp::kDnnFinalize)
      return error(ErrorCode::kNotSupported, "cuDNN query ", static_cast<unsigned>(call.op),
                   " has no host implementation on the simulated GPU");
    HIBER_ASSIGN_OR_RETURN(dnn::Graph graph, dnn::decode_graph(call.args));
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

  void release(uint64_t owner, std::optional<wire::LibraryHandle> handle) override {
    // Graphs belong to the session, not to a handle: they go when the session does.
    if (handle) return;
    MutexLock lock(mu_);
    graphs_.erase(owner);
  }
  // Graphs are the session's, in no context.
  void forget_context(Context) override {}

 private:
  static uint64_t extent(const dnn::TensorShape& s) {
    auto bytes = dnn::tensor_extent(dnn::as_tensor(s));
    return bytes.ok() ? *bytes : 0;
  }
  template <typename Op>
  static std::vector<SimDevice::Operand> xy(const Op& op) {
    return {{op.x_ptr, extent(op.x)}, {op.y_ptr, extent(op.y)}};
  }

  template <typename Op, typename Operands, typename Run>
  Status legacy(Stream stream, const LibraryCall& call, const char* name, Operands operands,
                Run run) {
    HIBER_ASSIGN_OR_RETURN(Op op, wire::read_op<Op>(call.args, name));
    HIBER_RETURN_IF_ERROR(dnn::check_op(op));
    return device_.enqueue_host_work(stream, operands(op), name, [op, run] {
      run(op);
      return Status();
    });
  }

  Status define_graph(const LibraryCall& call) {
    HIBER_ASSIGN_OR_RETURN(auto defined, dnn::decode_define_graph(call.args));
    HIBER_ASSIGN_OR_RETURN(dnn::Plan plan, dnn::interpret_plan(defined.second));
    if (plan.engine != kHostEngine)
      return error(ErrorCode::kNotSupported, "cuDNN plan with engine ", plan.engine,
                   ": the simulated GPU has engine 0 only");
    HIBER_RETURN_IF_ERROR(host_engine_supports(plan.graph));
    MutexLock lock(mu_);
    auto& owned = graphs_[call.owner];
    owned[defined.first] = std::make_shared<const dnn::Plan>(std::move(plan));
    return Status();
  }

  Status execute(Stream stream, const LibraryCall& call) {
    HIBER_ASSIGN_OR_RETURN(dnn::Execute e, dnn::decode_execute(call.args));
    std::shared_ptr<const dnn::Plan> plan;
    {
      MutexLock lock(mu_);
      auto owner = graphs_.find(call.owner);
      if (owner != graphs_.end()) {
        auto it = owner->second.find(e.header.graph_id);
        if (it != owner->second.end()) plan = it->second;
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
