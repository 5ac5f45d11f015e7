// The test programs' kernels on the simulated GPU, with no shim and no hiberd: the fatbin nvcc
// embedded in each program (its .nv_fatbin section, exactly what the shim will register) is
// loaded into a SimDevice with hiber_shim_programs_plugin, every kernel it holds must have a host
// implementation, and each kernel is launched on small inputs and compared with the CPU.
#include <elf.h>
#include <gtest/gtest.h>

#include <cmath>

#include "server/device/sim/numeric.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "common/fatbin.h"
#include "server/device/sim_device.h"

namespace hiber::device {
namespace {

using Bytes = std::vector<std::byte>;

std::string program_path(const std::string& name) {
  return std::string(HIBER_SHIM_PROGRAMS_DIR) + "/" + name;
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  Bytes out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// The contents of the ELF64 section `name` of `file`, or empty.
Bytes elf_section(const Bytes& file, const std::string& name) {
  Elf64_Ehdr eh;
  if (file.size() < sizeof(eh)) return {};
  std::memcpy(&eh, file.data(), sizeof(eh));
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64)
    return {};
  auto section = [&](unsigned i) {
    Elf64_Shdr sh{};
    const size_t at = eh.e_shoff + size_t{i} * eh.e_shentsize;
    if (at + sizeof(sh) <= file.size()) std::memcpy(&sh, file.data() + at, sizeof(sh));
    return sh;
  };
  const Elf64_Shdr names = section(eh.e_shstrndx);
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    const size_t name_at = names.sh_offset + sh.sh_name;
    if (name_at + name.size() + 1 > file.size()) continue;
    if (std::memcmp(file.data() + name_at, name.c_str(), name.size() + 1) != 0) continue;
    if (sh.sh_offset + sh.sh_size > file.size()) return {};
    return Bytes(file.begin() + sh.sh_offset, file.begin() + sh.sh_offset + sh.sh_size);
  }
  return {};
}

// The fatbin containers in a .nv_fatbin section: nvcc links one per object that has device code
// (the program's own, and an empty one from the runtime's startup code), back to back at 8-byte
// boundaries.
std::vector<Bytes> fatbin_containers(const Bytes& section) {
  std::vector<Bytes> out;
  size_t at = 0;
  while (at + 16 <= section.size()) {
    uint32_t magic = 0;
    uint64_t body = 0;
    std::memcpy(&magic, section.data() + at, 4);
    if (magic != fatbin::kFatbinMagic) {
      at += 8;  // padding
      continue;
    }
    std::memcpy(&body, section.data() + at + 8, 8);
    const size_t end = std::min(section.size(), at + 16 + body);
    out.emplace_back(section.begin() + at, section.begin() + end);
    at = (end + 7) / 8 * 8;
  }
  return out;
}

// Every kernel each program defines, by mangled name.
const std::map<std::string, std::set<std::string>>& expected_kernels() {
  static const std::map<std::string, std::set<std::string>> kernels = {
      {"vector_add", {"_Z10vector_addPKfS0_Pfi"}},
      {"saxpy_streams", {"_Z12saxpy_kernelifPKfPf"}},
      {"pinned_overlap", {"_Z12scale_offsetPKfPfiff"}},
      {"d2d_memset", {"_Z9xor_bytesPKhS0_Phy"}},
      {"tiny_mlp", {"_Z6matvecPKfS0_Pfii", "_Z9bias_reluPfPKfii"}},
      {"error_cases", {"_Z10vector_addPKfS0_Pfi"}},
      {"large_allocations", {"_Z9xor_bytesPKhS0_Phy"}},
      {"dlopen_runtime", {}},
      {"mlp_server",
       {"_Z6matvecPKfS0_Pfii", "_Z9bias_reluPfPKfii", "_Z8count_upPj",
        "_Z14gather_throughPKPKfxPf"}},
      {"library_gemm", {}},
      {"library_dnn_matmul", {}},
      {"library_dnn_attention", {}},
      {"library_transformer", {"_Z15softmax_columnsPviii", "_Z13add_layernormPKvS0_PvPKfS3_iifi"}},
  };
  return kernels;
}

class ShimProgramKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SimDeviceOptions options;
    // Both plugins, as hiberd loads them: their kernel names must not collide.
    options.kernel_plugins = {HIBER_TEST_KERNELS_PLUGIN, HIBER_SHIM_PROGRAMS_PLUGIN};
    auto device = SimDevice::create(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(device).value();
    auto stream = device_->create_stream(0, 0);
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *stream;
  }

  void TearDown() override {
    if (!device_) return;
    EXPECT_TRUE(device_->synchronize_stream(stream_).ok());
    for (const auto& a : allocations_) {
      EXPECT_TRUE(device_->unmap(a.va, a.bytes).ok());
      EXPECT_TRUE(device_->release_physical(a.memory).ok());
      EXPECT_TRUE(device_->free_address_range(a.va, a.bytes).ok());
    }
    for (const Module& m : modules_) EXPECT_TRUE(device_->unload_module(m).ok());
    EXPECT_TRUE(device_->destroy_stream(stream_).ok());
  }

  // Loads every container of the program's embedded fatbin; returns the kernels found, by name.
  std::map<std::string, Function> load_program(const std::string& name) {
    const Bytes section = elf_section(read_bytes(program_path(name)), ".nv_fatbin");
    std::map<std::string, Function> functions;
    if (name != "dlopen_runtime") {
      EXPECT_FALSE(section.empty()) << name << " has no .nv_fatbin";
    }
    for (const Bytes& image : fatbin_containers(section)) {
      auto kernels = fatbin::image_kernels(image);
      EXPECT_TRUE(kernels.ok()) << name << ": " << kernels.status();
      if (!kernels.ok()) continue;
      auto module = device_->load_module(image);
      EXPECT_TRUE(module.ok()) << name << ": " << module.status();
      if (!module.ok()) continue;
      modules_.push_back(*module);
      for (const KernelInfo& k : *kernels) {
        auto f = device_->get_function(*module, k.name);
        EXPECT_TRUE(f.ok()) << name << ": " << k.name << ": " << f.status();
        if (f.ok()) functions[k.name] = *f;
      }
    }
    return functions;
  }

  Function kernel(const std::string& program, const std::string& mangled) {
    auto functions = load_program(program);
    auto it = functions.find(mangled);
    EXPECT_NE(it, functions.end()) << program << " has no kernel " << mangled;
    return it == functions.end() ? Function{} : it->second;
  }

  // Device memory holding `values` (and room for `extra` more elements, zeroed); returns its
  // address.
  template <typename T>
  DevicePtr upload(const std::vector<T>& values, size_t extra = 0) {
    const uint64_t granularity = device_->allocation_granularity(0);
    const uint64_t want = std::max<uint64_t>(1, (values.size() + extra) * sizeof(T));
    Allocation a;
    a.bytes = (want + granularity - 1) / granularity * granularity;
    auto va = device_->reserve_address_range(a.bytes, 0);
    auto memory = device_->create_physical(0, a.bytes);
    EXPECT_TRUE(va.ok() && memory.ok());
    if (!va.ok() || !memory.ok()) return 0;
    a.va = *va;
    a.memory = *memory;
    const int gpus[] = {0};
    EXPECT_TRUE(device_->map(a.va, a.bytes, a.memory, 0).ok());
    EXPECT_TRUE(device_->set_access(a.va, a.bytes, gpus).ok());
    allocations_.push_back(a);
    EXPECT_TRUE(device_->memset(stream_, a.va, 0, 1, a.bytes).ok());
    if (!values.empty()) {
      EXPECT_TRUE(
          device_->copy_host_to_device(stream_, a.va, values.data(), values.size() * sizeof(T))
              .ok());
    }
    return a.va;
  }

  template <typename T>
  std::vector<T> download(DevicePtr src, size_t count) {
    std::vector<T> out(count);
    EXPECT_TRUE(device_->copy_device_to_host(stream_, out.data(), src, count * sizeof(T)).ok());
    Status done = device_->synchronize_stream(stream_);
    EXPECT_TRUE(done.ok()) << done;
    return out;
  }

  // Packs `args` at the offsets the kernel's layout gives, checking each size, and launches.
  template <typename... Args>
  void launch(Function f, Dim3 grid, Dim3 block, const Args&... args) {
    auto info = device_->function_info(f);
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_EQ(info->params.size(), sizeof...(Args)) << info->name;
    Bytes params(info->param_bytes());
    size_t i = 0;
    auto put = [&](const auto& v) {
      const ParamInfo p = info->params[i++];
      EXPECT_EQ(p.bytes, sizeof(v)) << info->name << " parameter " << i - 1;
      std::memcpy(params.data() + p.offset, &v, std::min<size_t>(p.bytes, sizeof(v)));
    };
    (put(args), ...);
    LaunchConfig config;
    config.grid = grid;
    config.block = block;
    Status launched = device_->launch(stream_, f, config, params);
    ASSERT_TRUE(launched.ok()) << launched;
    Status done = device_->synchronize_stream(stream_);
    ASSERT_TRUE(done.ok()) << done;
  }

  struct Allocation {
    DevicePtr va = 0;
    uint64_t bytes = 0;
    PhysicalMemory memory;
  };
  std::unique_ptr<SimDevice> device_;
  Stream stream_;
  std::vector<Allocation> allocations_;
  std::vector<Module> modules_;
};

TEST_F(ShimProgramKernelsTest, EveryProgramsKernelsAreExactlyTheExpectedOnes) {
  for (const auto& [program, kernels] : expected_kernels()) {
    std::set<std::string> found;
    for (const auto& [name, f] : load_program(program)) found.insert(name);
    EXPECT_EQ(found, kernels) << program;
  }
}

TEST_F(ShimProgramKernelsTest, VectorAdd) {
  for (const char* program : {"vector_add", "error_cases"}) {
    const Function f = kernel(program, "_Z10vector_addPKfS0_Pfi");
    const int n = 1000;  // not a multiple of the block: the guard matters
    std::vector<float> a(n), b(n), want(n + 24, 0.0f);
    for (int i = 0; i < n; ++i) {
      a[i] = static_cast<float>(i) * 0.25f;
      b[i] = static_cast<float>(i % 17) - 8.0f;
      want[i] = a[i] + b[i];
    }
    const DevicePtr da = upload(a), db = upload(b), dc = upload(std::vector<float>{}, n + 24);
    launch(f, {4, 1, 1}, {256, 1, 1}, da, db, dc, n);
    EXPECT_EQ(download<float>(dc, n + 24), want) << program;
  }
}

TEST_F(ShimProgramKernelsTest, SaxpyKernel) {
  const Function f = kernel("saxpy_streams", "_Z12saxpy_kernelifPKfPf");
  const int n = 777;
  std::vector<float> x(n), y(n), want(n + 11);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 61 - 30) / 8.0f;
    y[i] = static_cast<float>(i % 37 - 18) / 4.0f;
    want[i] = y[i] + 3.0f * x[i];
  }
  for (int i = n; i < n + 11; ++i) want[i] = 0.0f;
  const DevicePtr dx = upload(x), dy = upload(y, 11);
  launch(f, {4, 1, 1}, {256, 1, 1}, n, 3.0f, dx, dy);
  EXPECT_EQ(download<float>(dy, n + 11), want);
}

TEST_F(ShimProgramKernelsTest, ScaleOffset) {
  const Function f = kernel("pinned_overlap", "_Z12scale_offsetPKfPfiff");
  const int n = 1000;
  std::vector<float> in(n), want(n + 24, 0.0f);
  for (int i = 0; i < n; ++i) {
    in[i] = static_cast<float>(i % 97 - 48) / 8.0f;
    want[i] = in[i] * -0.5f + 0.125f;
  }
  const DevicePtr din = upload(in), dout = upload(std::vector<float>{}, n + 24);
  launch(f, {4, 1, 1}, {256, 1, 1}, din, dout, n, -0.5f, 0.125f);
  EXPECT_EQ(download<float>(dout, n + 24), want);
}

TEST_F(ShimProgramKernelsTest, XorBytes) {
  const Function f = kernel("d2d_memset", "_Z9xor_bytesPKhS0_Phy");
  const unsigned long long n = 1001;
  std::vector<unsigned char> a(n), b(n), want(n + 23, 0);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<unsigned char>(i * 131 + 7);
    b[i] = static_cast<unsigned char>(i ^ 0x5A);
    want[i] = a[i] ^ b[i];
  }
  const DevicePtr da = upload(a), db = upload(b),
                  dout = upload(std::vector<unsigned char>{}, n + 23);
  launch(f, {4, 1, 1}, {256, 1, 1}, da, db, dout, n);
  EXPECT_EQ(download<unsigned char>(dout, n + 23), want);
}

TEST_F(ShimProgramKernelsTest, MatvecAndBiasRelu) {
  const Function matvec = kernel("tiny_mlp", "_Z6matvecPKfS0_Pfii");
  const Function bias_relu = kernel("tiny_mlp", "_Z9bias_reluPfPKfii");
  const int rows = 40, cols = 32;  // two blocks of 32, the second partly idle
  std::vector<float> w(rows * cols), x(cols), bias(rows), want(rows);
  for (int i = 0; i < rows * cols; ++i) w[i] = static_cast<float>(i * 7 % 17 - 8) * 0.125f;
  for (int c = 0; c < cols; ++c) x[c] = static_cast<float>(c % 9 - 4) * 0.125f;
  for (int r = 0; r < rows; ++r) bias[r] = static_cast<float>(r % 5 - 2) * 0.25f;
  for (int r = 0; r < rows; ++r) {
    double sum = 0;  // exact: small multiples of 1/64
    for (int c = 0; c < cols; ++c) sum += double{w[r * cols + c]} * x[c];
    want[r] = static_cast<float>(sum);
  }
  const DevicePtr dw = upload(w), dx = upload(x), db = upload(bias);
  const DevicePtr dy = upload(std::vector<float>{}, rows);
  launch(matvec, {2, 1, 1}, {32, 1, 1}, dw, dx, dy, rows, cols);
  EXPECT_EQ(download<float>(dy, rows), want);

  // No ReLU: y + bias; then ReLU: negatives (and zeros) become 0.
  for (int r = 0; r < rows; ++r) want[r] += bias[r];
  launch(bias_relu, {2, 1, 1}, {32, 1, 1}, dy, db, rows, 0);
  EXPECT_EQ(download<float>(dy, rows), want);
  int negatives = 0;
  for (int r = 0; r < rows; ++r) {
    const float v = want[r] + bias[r];
    negatives += v < 0.0f;
    want[r] = v > 0.0f ? v : 0.0f;
  }
  ASSERT_GT(negatives, 0) << "the inputs do not exercise the ReLU";
  launch(bias_relu, {2, 1, 1}, {32, 1, 1}, dy, db, rows, 1);
  EXPECT_EQ(download<float>(dy, rows), want);
}

TEST_F(ShimProgramKernelsTest, CountUpIncrementsTheCounterOnce) {
  const Function count_up = kernel("mlp_server", "_Z8count_upPj");
  const std::vector<unsigned int> start = {41};  // read by the copy after this line returns
  const DevicePtr counter = upload(start);
  // Many threads, one increment: only thread 0 of block 0 counts.
  launch(count_up, {3, 1, 1}, {64, 1, 1}, counter);
  EXPECT_EQ(download<unsigned int>(counter, 1), std::vector<unsigned int>{42});
}

// library_transformer's softmax down columns and residual + layer norm, in fp32 (is_half 0)
// against a double reference (float sums of 16 or 24 terms: 1e-5 covers their rounding), and
// in fp16 (is_half 1): the same values stored in half.
TEST_F(ShimProgramKernelsTest, TransformerSoftmaxAndLayerNorm) {
  const Function softmax = kernel("library_transformer", "_Z15softmax_columnsPviii");
  const Function layernorm = kernel("library_transformer", "_Z13add_layernormPKvS0_PvPKfS3_iifi");
  const int rows = 16, cols = 40;  // two blocks of 32, the second partly idle
  std::vector<float> s(rows * cols);
  for (int i = 0; i < rows * cols; ++i) s[i] = static_cast<float>(i * 5 % 23 - 11) * 0.25f;
  const DevicePtr ds = upload(s);
  launch(softmax, {2, 1, 1}, {32, 1, 1}, ds, rows, cols, 0);
  const std::vector<float> p = download<float>(ds, s.size());
  for (int c = 0; c < cols; ++c) {
    double max = -1e30, sum = 0;
    for (int r = 0; r < rows; ++r) max = std::max(max, double{s[c * rows + r]});
    for (int r = 0; r < rows; ++r) sum += std::exp(s[c * rows + r] - max);
    for (int r = 0; r < rows; ++r)
      ASSERT_NEAR(p[c * rows + r], std::exp(s[c * rows + r] - max) / sum, 1e-6) << r << "," << c;
  }

  const int hidden = 24;
  std::vector<float> x(hidden * cols), res(hidden * cols), gamma(hidden), beta(hidden);
  for (int i = 0; i < hidden * cols; ++i) {
    x[i] = static_cast<float>(i * 7 % 19 - 9) * 0.125f;
    res[i] = static_cast<float>(i * 3 % 11 - 5) * 0.25f;
  }
  for (int r = 0; r < hidden; ++r) {
    gamma[r] = 1.0f + static_cast<float>(r % 5) * 0.125f;
    beta[r] = static_cast<float>(r % 3 - 1) * 0.5f;
  }
  const DevicePtr dx = upload(x), dres = upload(res), dg = upload(gamma), db = upload(beta);
  const DevicePtr dout = upload(std::vector<float>{}, x.size());
  launch(layernorm, {2, 1, 1}, {32, 1, 1}, dx, dres, dout, dg, db, hidden, cols, 1e-5f, 0);
  const std::vector<float> out = download<float>(dout, x.size());
  for (int c = 0; c < cols; ++c) {
    double mean = 0, var = 0;
    for (int r = 0; r < hidden; ++r) mean += double{x[c * hidden + r]} + res[c * hidden + r];
    mean /= hidden;
    for (int r = 0; r < hidden; ++r) {
      const double d = double{x[c * hidden + r]} + res[c * hidden + r] - mean;
      var += d * d;
    }
    var /= hidden;
    for (int r = 0; r < hidden; ++r) {
      const double want = (double{x[c * hidden + r]} + res[c * hidden + r] - mean) /
                              std::sqrt(var + 1e-5) * gamma[r] +
                          beta[r];
      ASSERT_NEAR(out[c * hidden + r], want, 1e-5) << r << "," << c;
    }
  }

  // fp16: inputs exact in half (multiples of 1/8 below 4); the outputs rounded to half once.
  auto to_half = [](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = sim::float_to_half(v[i]);
    return h;
  };
  // Named: the copies are asynchronous, and read the vectors until the stream synchronizes.
  const std::vector<uint16_t> x_half = to_half(x), res_half = to_half(res);
  const DevicePtr hx = upload(x_half), hres = upload(res_half);
  const DevicePtr hout = upload(std::vector<uint16_t>{}, x.size());
  launch(layernorm, {2, 1, 1}, {32, 1, 1}, hx, hres, hout, dg, db, hidden, cols, 1e-5f, 1);
  const std::vector<uint16_t> half_out = download<uint16_t>(hout, x.size());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(sim::half_to_float(half_out[i]), out[i], std::fabs(out[i]) * 1e-3 + 1e-4) << i;
}

}  // namespace
}  // namespace hiber::device
