// Unmodified CUDA inference functions invoked through hiber-router: mlp_server (an nvcc-built
// program linked with cuBLAS and cuDNN) as the router's worker, under the shim, against hiberd
// --device=sim. Every answer is checked against the host computation (tiny_mlp_model.h), and
// the models move between GPUs when one is drained.
#include <gtest/gtest.h>

#include <future>
#include <optional>
#include <set>

#include "tests/router/router_harness.h"
#include "tests/shim/shim_runner.h"
#include "wire/control_client.h"

namespace hiber::testing {
namespace {

using nlohmann::json;

struct MlpFunction {
  std::string name;
  uint64_t seed;
  size_t table_mib;
};

TEST(RouterMlp, AnswersMatchTheHostThroughTheRouter) {
  if (!shim::missing_shim().empty()) GTEST_SKIP() << shim::missing_shim();
  Hiberd hiberd(shim::sim_hiberd_options());
  const std::string state = temp_dir("hiber-router-mlp");
  RouterProcess router(state, {"--run_dir=" + hiberd.run_dir(), "--shim_preload=" + shim_preload(),
                               worker_programs_flag({shim::program_path("mlp_server")})});
  const std::vector<MlpFunction> functions = {{"mlp-a", 7, 0}, {"mlp-b", 8, 16}, {"mlp-c", 9, 4}};
  for (const MlpFunction& f : functions) {
    const json registration = {
        {"command",
         {shim::program_path("mlp_server"), std::to_string(f.seed), std::to_string(f.table_mib)}},
        {"shim", true},
        {"slo_ms", 10000}};
    ASSERT_EQ(router.load(f.name, registration).status, 200);
  }
  std::set<std::string> sources;
  for (int n = 0; n < 12; ++n) {
    const MlpFunction& f = functions[n % functions.size()];
    const long long entries = static_cast<long long>(f.table_mib) << 18;  // floats
    const long long entry = entries == 0 ? -1 : (n * 100003LL) % entries;
    router::HttpResponse answer =
        router.infer(f.name, std::to_string(n) + " " + std::to_string(entry));
    ASSERT_EQ(answer.status, 200) << answer.body << "\n" << router.log();
    EXPECT_EQ(answer.body, shim::mlp_server_answer(f.seed, n, entry)) << f.name << " n=" << n;
    sources.insert(answer.header("X-Hiber-Source").value_or("?"));
  }
  // The KServe form: one BYTES input holding the request line.
  const json request = {
      {"inputs",
       {{{"name", "request"}, {"shape", {1}}, {"datatype", "BYTES"}, {"data", {"5 17"}}}}}};
  router::HttpResponse kserve = router.infer("mlp-b", request.dump(), "application/json");
  ASSERT_EQ(kserve.status, 200) << kserve.body;
  EXPECT_EQ(json::parse(kserve.body)["outputs"][0]["data"][0], shim::mlp_server_answer(8, 5, 17));

  // Drain the GPU mlp-b runs on: its next request runs elsewhere, its model copied there from a
  // peer GPU or from host memory, and the answer is still right.
  router::HttpResponse before = router.infer("mlp-b", "1 2");
  ASSERT_EQ(before.status, 200);
  const int gpu = std::stoi(before.header("X-Hiber-Gpu").value_or("-1"));
  ASSERT_GE(gpu, 0);
  auto control = wire::ControlClient::connect(hiberd.control_socket_path());
  ASSERT_TRUE(control.ok()) << control.status();
  ASSERT_TRUE(control->drain(gpu).ok());
  router::HttpResponse after = router.infer("mlp-b", "2 3");
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.body, shim::mlp_server_answer(8, 2, 3));
  EXPECT_NE(after.header("X-Hiber-Gpu").value_or(""), std::to_string(gpu));
  const std::string source = after.header("X-Hiber-Source").value_or("");
  EXPECT_TRUE(source == "peer" || source == "host") << source;
  EXPECT_FALSE(after.header("X-Hiber-Link").value_or("").empty());
  ASSERT_TRUE(control->drain(gpu, /*resume=*/true).ok());

  // The router's numbers agree.
  EXPECT_EQ(router.function_status("mlp-b")["ok"], 7);
  EXPECT_GE(router.status()["swaps"].size(), 1u);
}

// A GPU function with max_instances 2 serves two requests at once, on two GPUs: the router
// starts a second worker while the first is busy, and each request's lease goes to the worker
// that serves it. The workers wait for each other inside their handlers (a barrier across
// processes), so the test fails unless both requests hold their GPUs at the same time.
TEST(RouterMlp, AGpuFunctionScalesToTwoInstancesOnTwoGpus) {
  if (!shim::missing_shim().empty()) GTEST_SKIP() << shim::missing_shim();
  Hiberd hiberd(shim::sim_hiberd_options());
  const std::string state = temp_dir("hiber-router-instances");
  const std::string barrier = temp_dir("hiber-router-barrier");
  RouterProcess router(state, {"--run_dir=" + hiberd.run_dir(), "--shim_preload=" + shim_preload(),
                               worker_programs_flag({test_worker_path()})});
  ASSERT_EQ(router
                .load("hot", {{"command", {test_worker_path()}},
                              {"shim", true},
                              {"max_instances", 2},
                              {"concurrency", 1},
                              {"slo_ms", 60000}})
                .status,
            200);
  auto together = [&] {
    return router.infer("hot", barrier + " 2", "application/x-test-file-barrier");
  };
  auto first = std::async(std::launch::async, together);
  auto second = std::async(std::launch::async, together);
  const router::HttpResponse a = first.get();
  const router::HttpResponse b = second.get();
  ASSERT_EQ(a.status, 200) << a.body << "\n" << router.log() << "\n" << hiberd.log();
  ASSERT_EQ(b.status, 200) << b.body << "\n" << router.log() << "\n" << hiberd.log();
  EXPECT_EQ(a.body, "together");
  EXPECT_EQ(b.body, "together");
  EXPECT_NE(a.header("X-Hiber-Gpu").value_or("a"), b.header("X-Hiber-Gpu").value_or("b"));
  EXPECT_EQ(router.function_status("hot")["instances"], 2);
  EXPECT_EQ(router.function_status("hot")["ok"], 2);
}

// A model allocated at start-up is the model even when the shim still holds the allocation in
// its batch as the worker starts serving (a batch waits for a quiet time, here 5 s): the SDK
// waits for the batch before its hello, so hiberd has it before the first request fixes the
// model. Without that wait the 16 MiB counted as the first request's scratch, never copied by
// a swap.
TEST(RouterMlp, AModelAllocatedAtStartUpIsTheModelWhileItsCallWaitsInABatch) {
  if (!shim::missing_shim().empty()) GTEST_SKIP() << shim::missing_shim();
  Hiberd hiberd(shim::sim_hiberd_options());
  const std::string state = temp_dir("hiber-router-model");
  RouterProcess router(state,
                       {"--run_dir=" + hiberd.run_dir(), "--shim_preload=" + shim_preload()});
  const json registration = {
      {"command", {test_worker_path()}},
      {"shim", true},
      {"slo_ms", 5000},
      {"env", {{"HIBER_TEST_MODEL_MIB", "16"}, {"HIBER_BATCH_QUIET_US", "5000000"}}}};
  ASSERT_EQ(router.load("weights", registration).status, 200);
  router::HttpResponse answer = router.infer("weights", "first");
  ASSERT_EQ(answer.status, 200) << answer.body << "\n" << router.log();
  ASSERT_EQ(answer.body, "first");
  ProgramResult status =
      run_program({"/bin/sh", "-c",
                   std::string(HIBERCTL_PATH) + " --run_dir=" + hiberd.run_dir() +
                       " status --json 2>/dev/null"});
  ASSERT_EQ(status.exit_code, 0) << status.output;
  const json node = json::parse(status.output, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(node.is_discarded()) << status.output;
  std::optional<uint64_t> model;
  for (const auto& f : node["functions"]) {
    if (f["functionId"] != "weights") continue;
    const json& bytes = f["modelBytes"];
    model = bytes.is_string() ? std::stoull(bytes.get<std::string>()) : bytes.get<uint64_t>();
  }
  ASSERT_TRUE(model.has_value()) << status.output;
  EXPECT_EQ(*model, uint64_t{16} << 20) << "the start-up allocation is the model";
}

}  // namespace
}  // namespace hiber::testing
