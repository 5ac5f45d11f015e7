// The checks of cuDNN calls (wire/dnn_ops.h): every value the client sent, and the device ranges
// each call reads and writes, from the declared dimensions, strides and data type of each tensor.
#include "server/library_calls.h"

#include "library_ops/dispatch.h"

namespace hiber::server {
namespace {

namespace dnn = library_ops::dnn;

Result<LibraryOperand> operand(const dnn::TensorShape& shape, uint64_t ptr, bool write,
                               const char* what) {
  HIBER_ASSIGN_OR_RETURN(uint64_t bytes, dnn::tensor_extent(dnn::as_tensor(shape)));
  if (ptr == 0) return error(ErrorCode::kInvalidValue, "cuDNN: ", what, " is a null pointer");
  return LibraryOperand{ptr, bytes, write, what};
}

// The operands of a legacy call: its checked struct's tensors.
template <typename Op>
Result<LibraryAccess> legacy(
    const Op& op,
    std::initializer_list<
        std::tuple<const dnn::TensorShape Op::*, const uint64_t Op::*, bool, const char*>>
        tensors) {
  HIBER_RETURN_IF_ERROR(dnn::check_op(op));
  LibraryAccess access;
  for (const auto& [shape, ptr, write, what] : tensors) {
    HIBER_ASSIGN_OR_RETURN(LibraryOperand o, operand(op.*shape, op.*ptr, write, what));
    access.operands.push_back(o);
  }
  return access;
}

Result<LibraryAccess> define_graph(std::span<const std::byte> args, DnnGraphs& graphs) {
  HIBER_ASSIGN_OR_RETURN(auto defined, dnn::decode_define_graph(args));
  auto& [id, graph] = defined;
  if (graphs.contains(id))
    return error(ErrorCode::kInvalidValue, "cuDNN define graph: graph id ", id,
                 " is already defined in this session");
  if (graphs.size() >= dnn::kMaxSessionGraphs)
    return error(ErrorCode::kOutOfMemory, "cuDNN define graph: the session already has ",
                 graphs.size(), " graphs, the most one session may define");
  HIBER_ASSIGN_OR_RETURN(dnn::Plan plan, dnn::interpret_plan(graph));
  graphs.emplace(id, std::make_shared<const dnn::Plan>(std::move(plan)));
  return LibraryAccess{};
}

Result<LibraryAccess> execute(std::span<const std::byte> args, const DnnGraphs& graphs) {
  HIBER_ASSIGN_OR_RETURN(dnn::Execute e, dnn::decode_execute(args));
  auto it = graphs.find(e.header.graph_id);
  if (it == graphs.end())
    return error(ErrorCode::kInvalidValue, "cuDNN execute: graph id ", e.header.graph_id,
                 " was not defined by this session");
  HIBER_ASSIGN_OR_RETURN(auto bound, dnn::bind_variant_pack(it->second->graph, e));
  LibraryAccess access;
  const dnn::OpGraph& g = it->second->graph;
  for (size_t t = 0; t < bound.size(); ++t) {
    if (g.tensors[t].is_virtual || g.tensors[t].by_value) continue;
    // Written: an output of some operation; read otherwise.
    bool write = false;
    for (const dnn::Op& op : g.ops)
      for (int out : dnn::op_outputs(op)) write = write || out == static_cast<int>(t);
    access.operands.push_back({bound[t].ptr, bound[t].bytes, write, "a variant pack tensor"});
  }
  if (e.header.workspace_bytes > 0) {
    if (e.header.workspace == 0)
      return error(ErrorCode::kInvalidValue, "cuDNN execute: the plan needs ",
                   e.header.workspace_bytes, " bytes of workspace and the variant pack has none");
    access.operands.push_back(
        {e.header.workspace, e.header.workspace_bytes, true, "the variant pack's workspace"});
  }
  return access;
}

}  // namespace

Result<LibraryAccess> check_dnn_call(library_ops::LibraryOp op, std::span<const std::byte> args,
                                     DnnGraphs& graphs) {
  using library_ops::LibraryOp;
  using library_ops::OpTag;
  using Bytes = std::span<const std::byte>;
  using B = dnn::BatchNormInference;
  using P = dnn::Pooling;
  using A = dnn::Activation;
  using S = dnn::Softmax;
  using T = dnn::AddTensor;
  return library_ops::dispatch<Result<LibraryAccess>, library_ops::Library::kDnn,
                               library_ops::Kind::kCall>(
      op, args, "hiberd",
      library_ops::Handlers{
          [&](OpTag<LibraryOp::kDnnDefineGraph>, Bytes bytes) {
            return define_graph(bytes, graphs);
          },
          [&](OpTag<LibraryOp::kDnnExecute>, Bytes bytes) { return execute(bytes, graphs); },
          [](OpTag<LibraryOp::kDnnBatchNormInference>, const B& b) {
            return legacy<B>(b, {{&B::x, &B::x_ptr, false, "x"},
                                 {&B::y, &B::y_ptr, true, "y"},
                                 {&B::bn, &B::scale, false, "bnScale"},
                                 {&B::bn, &B::bias, false, "bnBias"},
                                 {&B::bn, &B::mean, false, "estimatedMean"},
                                 {&B::bn, &B::variance, false, "estimatedVariance"}});
          },
          [](OpTag<LibraryOp::kDnnPooling>, const P& p) {
            return legacy<P>(p, {{&P::x, &P::x_ptr, false, "x"}, {&P::y, &P::y_ptr, true, "y"}});
          },
          [](OpTag<LibraryOp::kDnnActivation>, const A& a) {
            return legacy<A>(a, {{&A::x, &A::x_ptr, false, "x"}, {&A::y, &A::y_ptr, true, "y"}});
          },
          [](OpTag<LibraryOp::kDnnSoftmax>, const S& s) {
            return legacy<S>(s, {{&S::x, &S::x_ptr, false, "x"}, {&S::y, &S::y_ptr, true, "y"}});
          },
          [](OpTag<LibraryOp::kDnnAddTensor>, const T& t) {
            return legacy<T>(t, {{&T::a, &T::a_ptr, false, "A"}, {&T::c, &T::c_ptr, true, "C"}});
          }});
}

Status check_dnn_query(library_ops::LibraryOp op, std::span<const std::byte> args) {
  using library_ops::LibraryOp;
  using library_ops::OpTag;
  return library_ops::dispatch<Status, library_ops::Library::kDnn, library_ops::Kind::kQuery>(
      op, args, "hiberd",
      library_ops::Handlers{
          [](OpTag<LibraryOp::kDnnFinalize>, std::span<const std::byte> bytes) -> Status {
            HIBER_ASSIGN_OR_RETURN(dnn::Graph graph, dnn::decode_graph(bytes));
            return dnn::interpret_operation_graph(graph).status();
          }});
}

}  // namespace hiber::server
