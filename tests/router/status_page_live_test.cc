// The status page against a running node (docs/router.md, "Status page"): a real hiberd
// (--device=sim), a real hiber-router and shim-preloaded workers; traffic that loads models onto
// GPUs and, with a GPU drained, moves one elsewhere. Then status_page_test.sh --url loads the
// page in headless Chromium and checks what it drew: the numbers the test itself sent, and the
// nodes, GPUs, resident models and swaps the router's /v2/status reports at that moment.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "tests/router/router_harness.h"

namespace hiber::testing {
namespace {

using nlohmann::json;

std::string chromium_path() {
  const char* env = std::getenv("CHROMIUM");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/chromium";
}

json worker_registration(const std::string& program) {
  return {{"command", {program}}, {"slo_ms", 5000}, {"idle_timeout_s", 600}, {"shim", true}};
}

// The GPU an answer ran on, as X-Hiber-Gpu says (-1 when absent).
int gpu_of(const router::HttpResponse& r) {
  return std::stoi(r.header("X-Hiber-Gpu").value_or("-1"));
}

TEST(StatusPageLive, DrawsARunningNode) {
  if (shim_preload().empty()) {
    GTEST_SKIP() << "built without the CUDA toolkit: no shim, so no request reaches hiberd";
  }
  if (::access(chromium_path().c_str(), X_OK) != 0) {
    GTEST_SKIP() << "no Chromium at " << chromium_path() << " (set $CHROMIUM)";
  }
  Hiberd hiberd;
  const std::string state = temp_dir("hiber-status-live");
  RouterProcess router(state,
                       {"--run_dir=" + hiberd.run_dir(), "--shim_preload=" + shim_preload()});

  // Two echo functions, alpha with a 16 MiB model it allocates at start-up (it moves later: a
  // swap that brings bytes), and mem, whose first request allocates 64 MiB of scratch; each with
  // its own count (mem's allocation is one of its requests).
  const std::map<std::string, int> sent = {{"alpha", 4}, {"beta", 2}, {"gamma", 1}, {"mem", 3}};
  std::map<std::string, int> gpu;  // where each function last ran
  for (const auto& [name, count] : sent) {
    json registration = worker_registration(name == "alpha" || name == "mem" ? test_worker_path()
                                                                             : echo_worker_path());
    if (name == "alpha") registration["env"] = {{"HIBER_TEST_MODEL_MIB", "16"}};
    ASSERT_EQ(router.load(name, registration).status, 200);
  }
  router::HttpResponse alloc = router.infer("mem", "64", "application/x-test-alloc");
  ASSERT_EQ(alloc.status, 200) << alloc.body;
  ASSERT_EQ(alloc.body, "allocated 64 MiB");
  gpu["mem"] = gpu_of(alloc);
  for (const auto& [name, count] : sent) {
    for (int i = name == "mem" ? 1 : 0; i < count - (name == "alpha" ? 1 : 0); ++i) {
      const std::string body = name + " " + std::to_string(i);
      router::HttpResponse r = router.infer(name, body);
      ASSERT_EQ(r.status, 200) << r.body;
      ASSERT_EQ(r.body, body);
      gpu[name] = gpu_of(r);
      ASSERT_GE(gpu[name], 0) << "the request did not go through hiberd";
    }
  }
  // Every GPU alpha's model is on is drained: its last request loads alpha onto another GPU, a
  // swap. (There may be two: when its first request ran on another GPU than its start-up, the
  // swap there left a replica on each, GPUs not being short of memory.) Where the replicas are
  // is read from hiberd itself (`hiberctl status --json`), not from the router's view of the
  // node, which is refreshed once a second and may not show a replica yet.
  const auto hiberctl = [&](const std::string& args) {
    ProgramResult r =
        run_program({"/bin/sh", "-c",
                     std::string(HIBERCTL_PATH) + " --run_dir=" + hiberd.run_dir() + " " + args});
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.output;
    return r.output;
  };
  std::set<int> drained;
  {
    const std::string text = hiberctl("status --json 2>/dev/null");
    const json node = json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(node.is_discarded()) << text;
    for (const auto& f : node["functions"]) {
      if (f["functionId"] != "alpha") continue;
      for (const auto& g : f["residentGpus"]) drained.insert(g.get<int>());
    }
    ASSERT_FALSE(drained.empty()) << "hiberd does not have alpha's model on a GPU: " << text;
  }
  for (int g : drained) hiberctl("drain --gpu=" + std::to_string(g));
  router::HttpResponse moved = router.infer("alpha", "moved");
  ASSERT_EQ(moved.status, 200) << moved.body;
  EXPECT_EQ(moved.body, "moved");
  gpu["alpha"] = gpu_of(moved);
  EXPECT_EQ(drained.count(gpu["alpha"]), 0u) << "ran on a drained GPU";
  EXPECT_NE(moved.header("X-Hiber-Source").value_or("resident"), "resident")
      << "on GPU " << gpu["alpha"] << "; hiberd now: " << hiberctl("status 2>/dev/null");
  const std::string link = moved.header("X-Hiber-Link").value_or("");
  EXPECT_FALSE(link.empty());
  for (int g : drained) hiberctl("drain --gpu=" + std::to_string(g) + " --resume");

  // The router reports the requests once each finished, and residency from hiberd's status
  // (polled every 100 ms): wait until it has caught up with what the test did.
  json status;
  ASSERT_TRUE(eventually([&] {
    status = router.status();
    for (const auto& f : status["functions"]) {
      if (f["requests"] != sent.at(f["name"].get<std::string>())) return false;
    }
    for (const auto& g : status["nodes"][0]["gpus"]) {
      if (g["ordinal"] == gpu["alpha"]) {
        const json& resident = g["resident"];
        return std::find(resident.begin(), resident.end(), "alpha") != resident.end();
      }
    }
    return false;
  })) << status.dump(2);

  std::vector<std::string> args = {
      std::string(HIBER_SOURCE_DIR) + "/tests/router/status_page_test.sh",
      "--chromium=" + chromium_path(),
      "--url=http://127.0.0.1:" + std::to_string(router.target().port) + "/",
      "--expect-functions=" + std::to_string(sent.size())};
  // The test's own numbers: every request answered, none failed or refused.
  for (const auto& [name, count] : sent) {
    args.push_back("--expect-function=" + name);
    args.push_back(str_cat("--expect-function-field=", name, ":requests=", count));
    args.push_back(str_cat("--expect-function-field=", name, ":ok=", count));
    args.push_back("--expect-function-field=" + name + ":failed=0");
    args.push_back("--expect-function-field=" + name + ":rejected=0");
    args.push_back("--expect-function-field=" + name + ":slo_ms=5000 ms");
    args.push_back("--expect-function-field=" + name + ":slo_met=100.0%");
    args.push_back("--expect-function-field=" + name + ":instances=0 / 1");
    // Where each function last ran, its model stays (no GPU is short of memory).
    args.push_back(str_cat("--expect-resident=node0/", gpu[name], ":", name));
  }
  args.push_back("--expect-swap=alpha:" + link);
  // The rest as the router reports it: the node, every GPU and resident model, every swap.
  ASSERT_EQ(status["nodes"].size(), 1u);
  const json& node = status["nodes"][0];
  args.push_back("--expect-node=" + node["name"].get<std::string>() + ":up");
  EXPECT_EQ(node["name"], "node0");
  EXPECT_FALSE(node["gpus"].empty());
  for (const auto& g : node["gpus"]) {
    const std::string id = str_cat("node0/", g["ordinal"].get<int>());
    args.push_back("--expect-gpu=" + id);
    for (const auto& fn : g["resident"])
      args.push_back("--expect-resident=" + id + ":" + fn.get<std::string>());
  }
  std::set<std::string> swapped;
  for (const auto& s : status["swaps"]) {
    swapped.insert(s["function"].get<std::string>());
    args.push_back("--expect-swap=" + s["function"].get<std::string>() + ":" +
                   s["link"].get<std::string>());
  }
  // A first request finds nothing to bring (its model is made where it runs): no swap. Only
  // alpha has a model before its first request, so only alpha swaps: when its GPUs were drained,
  // and at its first request if that ran elsewhere than its start-up.
  EXPECT_EQ(swapped, (std::set<std::string>{"alpha"})) << status["swaps"];
  args.push_back(str_cat("--expect-swaps-min=", status["swaps"].size()));

  ProgramResult checked = run_program(args, std::chrono::seconds(120));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_NE(checked.output.find(" 0 failed"), std::string::npos) << checked.output;
  std::cout << checked.output;
}

}  // namespace
}  // namespace hiber::testing
