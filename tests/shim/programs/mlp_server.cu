// mlp_server: the tiny MLP of tiny_mlp.cu as an inference function that serves requests, the
// way a serverless function does: it loads its model once (cudaMalloc + cudaMemcpy), says
// "ready", then answers one request per line of stdin until "quit" or end of input. Started by
// hiber-router (HIBER_WORKER_SOCKET set), it serves the router's requests through the function
// SDK (router/function_sdk.h) instead, until the router closes the connection: a request's body
// is one request line, as raw bytes (any content type but JSON) or as a KServe v2 JSON request
// with one BYTES input holding it; the answer is the answer line without its newline, as
// text/plain or, for a JSON request, a KServe answer with one BYTES output "answer" holding it.
// A bad request line is then an error answer, and the worker goes on serving.
//
// Usage: mlp_server <seed> [table_mib = 0] [keep_going]
//   seed       which weights (tiny_mlp_model.h): every function of a test gets its own
//   table_mib  an extra model tensor of this many MiB (a lookup table filled from the seed),
//              so the model spans several device blocks; each request reads one entry back
//   keep_going serving stdin, a request whose CUDA call fails is answered "error <why>" and
//              serving goes on (as it always does for the router), instead of exiting 1
//
// A request line: "<input index> <table entry>" (entry -1: do not read the table). Its answer:
//   "result <input index> <8 outputs> <table value>"   floats as C99 hex (%a), exact
// Or "hold <ms>": a kernel increments the counter, the host waits <ms> milliseconds with it in
// flight, then reads the counter back: "hold <value>" (for tests that stop hiberd mid-request).
// Or "count": a kernel increments a counter kept in device memory since start-up, and the
// answer is "count <value>" (state that survives between requests only where hiberd keeps it).
// Or "indirect <table entry>": a kernel reads the entry through an array of table pointers the
// request uploads (as a batched GEMM reads its matrices), so its arguments never name the
// table; the answer is "indirect <entry> <value>".
// Or "gemm <table entry>": cuBLAS reads the entry twice, by a 1x1 cublasSgemm whose A is the
// entry (hiberd sees the operand and waits for its swap group) and by a 1x1 cublasGemmBatchedEx
// whose A comes from a pointer array (hiberd cannot see where: it waits for the whole model);
// the answer is "gemm <entry> <value> <value>".
// Or "graph <table entry>": a CUDA graph captured on the first request naming the entry (a 1x1
// cublasSgemm of the entry and 1.0, and a copy of the entry, both into scratch memory, then to
// pinned host memory) is launched; later requests launch the same graph, on whichever GPU
// hiberd runs the function then; the answer is "graph <entry> <value> <value>".
// Or "conv <table entry>": a 1x1 convolution through cuDNN's backend API (cudnn_conv.h) whose X
// is the entry and whose W is the last table entry holding 1.0 (table_mib >= 1: every value
// recurs each 65536 entries), so both operands are model memory, in the table's last 256 KiB
// when the entry is too; the answer is "conv <entry> <value>". The graph and plan are built at
// the first conv request and reused (PyTorch caches its plans); the variant pack, which binds
// this request's addresses, is built per request, as PyTorch does.
// Per request the program allocates its activations and frees them afterwards, as a framework
// with a fresh workspace would: those are the function's scratch, the rest its model.
// Exits 0 after "quit" (or when the router closes the connection), 1 on a CUDA error (printed),
// 2 on bad arguments or, reading stdin, a bad request line; 3 on a broken worker connection.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "cudnn_conv.h"
#include "program_util.h"
#include "router/function_sdk.h"
#include "tiny_mlp_kernels.cuh"
#include "tiny_mlp_model.h"

__global__ void count_up(unsigned int* counter) {
  if (blockIdx.x == 0 && threadIdx.x == 0) ++*counter;
}

__global__ void gather_through(const float* const* tables, long long entry, float* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = tables[0][entry];
}

using namespace tiny_mlp;

namespace {

// The conv request's cuDNN state, made at its first use and kept, as a framework keeps its
// handle and plan cache.
struct Conv {
  cudnnHandle_t handle = nullptr;
  cudnn_conv::ConvGraph graph{};
  cudnnBackendDescriptor_t plan = nullptr;
};

// printf into a std::string.
std::string format(const char* pattern, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* pattern, ...) {
  char text[512];
  va_list args;
  va_start(args, pattern);
  std::vsnprintf(text, sizeof text, pattern, args);
  va_end(args);
  return text;
}

// The function's model and state, and the answer to one request line.
struct Server {
  std::vector<Layer> layers;
  DeviceModel model;
  float* d_table = nullptr;
  size_t table_entries = 0;
  long long one_entry = -1;  // the conv request's W (see main)
  unsigned int* d_counter = nullptr;
  cublasHandle_t blas = nullptr;
  Conv conv;
  // The graph requests': one executable graph per table entry, made on first use.
  std::map<long long, cudaGraphExec_t> graphs;
  cudaStream_t graph_stream = nullptr;
  float* graph_scratch = nullptr;
  float* graph_out = nullptr;  // pinned

  // The answer line (without its newline), or false for a bad request line. A CUDA error exits.
  bool answer(const std::string& line, std::string& out);
};

bool Server::answer(const std::string& line_text, std::string& out) {
  const char* line = line_text.c_str();
  out.clear();
  if (std::strncmp(line, "hold", 4) == 0) {
    int ms = -1;
    if (std::sscanf(line + 4, "%d", &ms) != 1 || ms < 0 || ms > 600000) return false;
    count_up<<<1, 1>>>(d_counter);
    CUDA_CHECK_LAUNCH();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    unsigned int value = 0;
    CUDA_CHECK(cudaMemcpy(&value, d_counter, sizeof value, cudaMemcpyDeviceToHost));
    out = format("hold %u", value);
    return true;
  }
  if (std::strncmp(line, "count", 5) == 0) {
    count_up<<<1, 1>>>(d_counter);
    CUDA_CHECK_LAUNCH();
    unsigned int value = 0;
    CUDA_CHECK(cudaMemcpy(&value, d_counter, sizeof value, cudaMemcpyDeviceToHost));
    out = format("count %u", value);
    return true;
  }
  if (std::strncmp(line, "gemm", 4) == 0) {
    long long entry = -1;
    if (std::sscanf(line + 4, "%lld", &entry) != 1 || entry < 0 ||
        static_cast<size_t>(entry) >= table_entries) {
      return false;
    }
    // Scratch: 1.0 as B, the two results, and the pointer arrays of the batched call.
    float* d_scratch = nullptr;  // [one, direct, batched]
    void** d_arrays = nullptr;   // [A, B, C]
    CUDA_CHECK(cudaMalloc(&d_scratch, 3 * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_arrays, 3 * sizeof(void*)));
    const float one = 1.0f, zero = 0.0f;
    CUDA_CHECK(cudaMemcpy(d_scratch, &one, sizeof one, cudaMemcpyHostToDevice));
    void* arrays[3] = {d_table + entry, d_scratch, d_scratch + 2};
    CUDA_CHECK(cudaMemcpy(d_arrays, arrays, sizeof arrays, cudaMemcpyHostToDevice));
    bool ok = cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, d_table + entry, 1,
                          d_scratch, 1, &zero, d_scratch + 1, 1) == CUBLAS_STATUS_SUCCESS;
    ok = ok &&
         cublasGemmBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, d_arrays, CUDA_R_32F, 1,
                             d_arrays + 1, CUDA_R_32F, 1, &zero, d_arrays + 2, CUDA_R_32F, 1, 1,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    if (!ok) {
      std::fprintf(stderr, "mlp_server: a cuBLAS call failed\n");
      std::exit(program::kExitCudaError);
    }
    float values[2] = {0, 0};
    CUDA_CHECK(cudaMemcpy(values, d_scratch + 1, sizeof values, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_scratch));
    CUDA_CHECK(cudaFree(d_arrays));
    out = format("gemm %lld %a %a", entry, static_cast<double>(values[0]),
                 static_cast<double>(values[1]));
    return true;
  }
  if (std::strncmp(line, "conv", 4) == 0) {
    long long entry = -1;
    if (std::sscanf(line + 4, "%lld", &entry) != 1 || entry < 0 ||
        static_cast<size_t>(entry) >= table_entries || one_entry < 0) {
      return false;
    }
    if (conv.plan == nullptr) {
      CUDNN_CHECK(cudnnCreate(&conv.handle));
      cudnn_conv::Shape shape;          // 1x1, fp32
      shape.alignment = sizeof(float);  // X and W are table entries
      conv.graph = cudnn_conv::conv_graph(conv.handle, shape);
      conv.plan = cudnn_conv::plan_for(conv.handle, conv.graph.graph);
    }
    // Scratch: the output and any workspace the plan's engine wants.
    float* d_y = nullptr;
    void* workspace = nullptr;
    CUDA_CHECK(cudaMalloc(&d_y, sizeof(float)));
    const int64_t workspace_bytes = cudnn_conv::workspace_size(conv.plan);
    if (workspace_bytes > 0) CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    cudnnBackendDescriptor_t pack =
        cudnn_conv::variant_pack(d_table + entry, d_table + one_entry, d_y, workspace);
    CUDNN_CHECK(cudnnBackendExecute(conv.handle, conv.plan, pack));
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
    float value = 0.0f;
    CUDA_CHECK(cudaMemcpy(&value, d_y, sizeof value, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_y));
    if (workspace != nullptr) CUDA_CHECK(cudaFree(workspace));
    out = format("conv %lld %a", entry, static_cast<double>(value));
    return true;
  }
  if (std::strncmp(line, "graph", 5) == 0) {
    long long entry = -1;
    if (std::sscanf(line + 5, "%lld", &entry) != 1 || entry < 0 ||
        static_cast<size_t>(entry) >= table_entries) {
      return false;
    }
    // Scratch [one, by cuBLAS, by copy] is rewritten by every launch: a swap re-places scratch
    // without its contents. The 1.0 comes from pinned memory, read at each launch.
    auto it = graphs.find(entry);
    if (it == graphs.end()) {
      if (graph_stream == nullptr) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&graph_stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaMalloc(&graph_scratch, 3 * sizeof(float)));
        CUDA_CHECK(cudaMallocHost(&graph_out, 3 * sizeof(float)));
      }
      const float one = 1.0f, zero = 0.0f;
      CUDA_CHECK(cudaStreamBeginCapture(graph_stream, cudaStreamCaptureModeGlobal));
      CUDA_CHECK(cudaMemcpyAsync(graph_scratch, graph_out + 2, sizeof(float),
                                 cudaMemcpyHostToDevice, graph_stream));
      CUDA_CHECK(cudaMemcpyAsync(graph_scratch + 2, d_table + entry, sizeof(float),
                                 cudaMemcpyDeviceToDevice, graph_stream));
      bool ok = cublasSetStream(blas, graph_stream) == CUBLAS_STATUS_SUCCESS &&
                cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, d_table + entry, 1,
                            graph_scratch, 1, &zero, graph_scratch + 1, 1) ==
                    CUBLAS_STATUS_SUCCESS &&
                cublasSetStream(blas, nullptr) == CUBLAS_STATUS_SUCCESS;
      if (!ok) {
        std::fprintf(stderr, "mlp_server: a cuBLAS call failed in a capture\n");
        std::exit(program::kExitCudaError);
      }
      CUDA_CHECK(cudaMemcpyAsync(graph_out, graph_scratch + 1, 2 * sizeof(float),
                                 cudaMemcpyDeviceToHost, graph_stream));
      cudaGraph_t graph = nullptr;
      CUDA_CHECK(cudaStreamEndCapture(graph_stream, &graph));
      cudaGraphExec_t exec = nullptr;
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
      it = graphs.emplace(entry, exec).first;
    }
    graph_out[0] = graph_out[1] = 0.0f;
    graph_out[2] = 1.0f;
    CUDA_CHECK(cudaGraphLaunch(it->second, graph_stream));
    CUDA_CHECK(cudaStreamSynchronize(graph_stream));
    out = format("graph %lld %a %a", entry, static_cast<double>(graph_out[0]),
                 static_cast<double>(graph_out[1]));
    return true;
  }
  if (std::strncmp(line, "indirect", 8) == 0) {
    long long entry = -1;
    if (std::sscanf(line + 8, "%lld", &entry) != 1 || entry < 0 ||
        static_cast<size_t>(entry) >= table_entries) {
      return false;
    }
    // The pointer array and the output are this request's scratch.
    const float* const tables[1] = {d_table};
    const float** d_tables = nullptr;
    float* d_out = nullptr;
    CUDA_CHECK(cudaMalloc(&d_tables, sizeof tables));
    CUDA_CHECK(cudaMalloc(&d_out, sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_tables, tables, sizeof tables, cudaMemcpyHostToDevice));
    gather_through<<<1, 1>>>(d_tables, entry, d_out);
    CUDA_CHECK_LAUNCH();
    float value = 0.0f;
    CUDA_CHECK(cudaMemcpy(&value, d_out, sizeof value, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_tables));
    CUDA_CHECK(cudaFree(d_out));
    out = format("indirect %lld %a", entry, static_cast<double>(value));
    return true;
  }
  int input = -1;
  long long entry = 0;
  if (std::sscanf(line, "%d %lld", &input, &entry) != 2 || input < 0 || entry < -1 ||
      (entry >= 0 && static_cast<size_t>(entry) >= table_entries)) {
    return false;
  }
  // This request's activations: scratch, allocated and freed per request.
  std::vector<float*> d_act(kLayers + 1);
  for (int l = 0; l <= kLayers; ++l) CUDA_CHECK(cudaMalloc(&d_act[l], kDims[l] * sizeof(float)));
  const std::vector<float> x = make_input(input);
  CUDA_CHECK(cudaMemcpy(d_act[0], x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  forward(layers, model, d_act);
  float result[kDims[kLayers]];
  CUDA_CHECK(cudaMemcpy(result, d_act[kLayers], sizeof result, cudaMemcpyDeviceToHost));
  float value = 0.0f;
  if (entry >= 0) {
    CUDA_CHECK(cudaMemcpy(&value, d_table + entry, sizeof value, cudaMemcpyDeviceToHost));
  }
  for (float* p : d_act) CUDA_CHECK(cudaFree(p));
  out = format("result %d", input);
  for (float v : result) out += format(" %a", static_cast<double>(v));
  out += format(" %a", static_cast<double>(value));
  return true;
}

// One request line from stdin: without its line ending, as Server::answer takes it.
std::string strip_newline(const char* line) {
  std::string text(line);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

// Serves requests from stdin until "quit" or end of input: the exit status.
int serve_stdin(Server& server, bool keep_going) {
  program::cuda_failures_throw() = keep_going;
  char line[256];
  std::string out;
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
    if (std::strncmp(line, "quit", 4) == 0) break;
    bool good = false;
    try {
      good = server.answer(strip_newline(line), out);
    } catch (const std::exception& e) {
      std::printf("error %s\n", e.what());
      (void)cudaGetLastError();  // reported: the next request starts clean, as CUDA allows
      continue;
    }
    if (!good) {
      std::printf("bad request: %s", line);
      return program::kExitUsage;
    }
    std::printf("%s\n", out.c_str());
  }
  return 0;
}

// Serves hiber-router's requests through the function SDK: the exit status. A request it cannot
// read is the client's mistake (400); a CUDA call that fails answers the request with the call,
// its error and hiberd's reason (500: on the simulated GPU without --sim_kernel_plugins, "the
// simulated GPU has no host implementation of this kernel"), and serving goes on.
int serve_router(Server& server) {
  namespace fn = hiber::function;
  program::cuda_failures_throw() = true;
  std::mutex one_at_a_time;  // the server's state is not thread-safe; requests take turns
  return fn::serve([&](const fn::Request& request) -> std::variant<fn::Response, std::string> {
    const bool kserve = request.content_type.rfind("application/json", 0) == 0;
    std::string line = request.body;
    if (kserve) {
      auto inputs = fn::parse_inputs(request);
      if (auto* problem = std::get_if<std::string>(&inputs)) throw fn::ClientError(*problem);
      const auto& tensors = std::get<std::vector<fn::Tensor>>(inputs);
      const auto* lines =
          tensors.size() == 1 ? std::get_if<std::vector<std::string>>(&tensors[0].data) : nullptr;
      if (lines == nullptr || lines->size() != 1) {
        throw fn::ClientError("mlp_server takes one BYTES input holding one request line");
      }
      line = (*lines)[0];
    }
    line = strip_newline(line.c_str());
    std::string out;
    {
      std::lock_guard<std::mutex> lock(one_at_a_time);
      if (!server.answer(line, out)) throw fn::ClientError("bad request: " + line);
    }
    if (!kserve) return fn::Response{"text/plain", out};
    return fn::outputs_response({fn::Tensor{"answer", "BYTES", {1}, std::vector<std::string>{out}}},
                                request.id);
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: mlp_server <seed> [table_mib]\n");
    return program::kExitUsage;
  }
  const uint64_t seed = static_cast<uint64_t>(program::int_arg(argc, argv, 1, 0, 0, 1LL << 40));
  const size_t table_mib = static_cast<size_t>(program::int_arg(argc, argv, 2, 0, 0, 1024));
  const bool keep_going = argc > 3 && std::strcmp(argv[3], "keep_going") == 0;
  Server server;
  server.table_entries = table_mib * (1 << 20) / sizeof(float);
  const size_t table_entries = server.table_entries;

  CUDA_CHECK(cudaSetDevice(0));
  server.layers = make_model(seed);
  server.model = upload_model(server.layers);
  if (table_entries > 0) {
    std::vector<float> table(table_entries);
    for (size_t i = 0; i < table_entries; ++i) table[i] = table_value(seed, i);
    CUDA_CHECK(cudaMalloc(&server.d_table, table_entries * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(server.d_table, table.data(), table_entries * sizeof(float),
                          cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaMalloc(&server.d_counter, sizeof(unsigned int)));
  CUDA_CHECK(cudaMemset(server.d_counter, 0, sizeof(unsigned int)));
  if (cublasCreate(&server.blas) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "mlp_server: cublasCreate failed\n");
    return program::kExitCudaError;
  }
  // The last table entry holding 1.0: the conv request's W. Entries i and i + 65536 hold the same
  // value and the values of 65536 consecutive entries are a permutation of 0..65535 (40503 is
  // odd), so a table of at least 65536 entries has one in its last 65536.
  for (size_t i = table_entries; i-- > 0 && table_entries - i <= 65536;) {
    if (table_value(seed, i) == 1.0f) {
      server.one_entry = static_cast<long long>(i);
      break;
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("ready seed=%llu table_mib=%zu\n", static_cast<unsigned long long>(seed), table_mib);

  const char* worker_socket = std::getenv("HIBER_WORKER_SOCKET");
  const int status = worker_socket != nullptr && *worker_socket != '\0' ? serve_router(server)
                                                                        : serve_stdin(server, keep_going);
  if (status != 0) return status;
  if (cublasDestroy(server.blas) != CUBLAS_STATUS_SUCCESS) return program::kExitCudaError;
  if (server.conv.plan != nullptr) {
    CUDNN_CHECK(cudnnBackendDestroyDescriptor(server.conv.plan));
    server.conv.graph.destroy();
    CUDNN_CHECK(cudnnDestroy(server.conv.handle));
  }
  free_model(server.model);
  if (server.d_table != nullptr) CUDA_CHECK(cudaFree(server.d_table));
  CUDA_CHECK(cudaFree(server.d_counter));
  return 0;
}
