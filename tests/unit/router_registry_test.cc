// The router's registry: registrations parsed and checked field by field, kept on disk one file
// per function and read back by a new Registry, as a restarted router does.
#include "router/registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "router/node_client.h"

namespace hiber::router {
namespace {

namespace fs = std::filesystem;

std::string temp_state() {
  std::string pattern = "/tmp/hiber-registry-XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

TEST(FunctionSpec, ParsesEveryField) {
  auto spec = parse_function_spec("fn-1", R"({
    "command": ["/bin/worker", "--x"], "env": {"A": "1"}, "shim": true, "slo_ms": 120.5,
    "percentile": 0.99, "quota_mib": 512, "concurrency": 4, "max_instances": 1,
    "stateful": true, "idle_timeout_s": 30, "exec_ms_hint": 7, "heavy": false})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->command, (std::vector<std::string>{"/bin/worker", "--x"}));
  EXPECT_EQ(spec->env.at("A"), "1");
  EXPECT_TRUE(spec->shim);
  EXPECT_EQ(spec->slo_ms, 120.5);
  EXPECT_EQ(spec->concurrency, 4u);
  EXPECT_EQ(spec->idle_timeout, std::chrono::seconds(30));
  ASSERT_TRUE(spec->heavy.has_value());
  EXPECT_FALSE(*spec->heavy);
  const wire::FunctionRegistration r = spec->registration();
  EXPECT_EQ(r.function_id, "fn-1");
  EXPECT_EQ(r.slo_ms, 120.5);
  EXPECT_EQ(r.tail_percentile, 0.99);
  EXPECT_EQ(r.quota_bytes, 512ull << 20);
  EXPECT_TRUE(r.stateful);
  EXPECT_EQ(r.exec_ms_hint, 7);
}

TEST(FunctionSpec, DefaultsAndRoundTrip) {
  auto spec = parse_function_spec("f", R"({"command": ["w"]})");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->slo_ms, 1000);
  EXPECT_EQ(spec->concurrency, 1u);
  EXPECT_FALSE(spec->shim);
  EXPECT_FALSE(spec->heavy.has_value());
  auto again = parse_function_spec("f", spec->to_json().dump());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->to_json(), spec->to_json());
}

// A function whose workers attach by themselves has no command; it survives the registry's file.
TEST(FunctionSpec, External) {
  auto spec = parse_function_spec("f", R"({"external": true, "concurrency": 4})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->external);
  EXPECT_TRUE(spec->command.empty());
  EXPECT_EQ(spec->concurrency, 4u);
  EXPECT_FALSE(spec->to_json().contains("command"));
  auto again = parse_function_spec("f", spec->to_json().dump());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->external);
  EXPECT_FALSE(parse_function_spec("f", R"({"command": ["w"]})")->external);
  auto both = parse_function_spec("f", R"({"external": true, "command": ["w"]})");
  EXPECT_NE(both.status().message().find("must be absent with external: true"), std::string::npos)
      << both.status();
}

TEST(FunctionSpec, RefusesWhatMakesNoSense) {
  const char* bad[] = {"not json",
                       "[1]",
                       "{}",
                       R"({"command": []})",
                       R"({"command": [""]})",
                       R"({"command": [1]})",
                       R"({"command": ["w"], "slo_ms": -1})",
                       R"({"command": ["w"], "slo_ms": "fast"})",
                       R"({"command": ["w"], "percentile": 1})",
                       R"({"command": ["w"], "concurrency": 0})",
                       R"({"command": ["w"], "concurrency": 1.5})",
                       R"({"command": ["w"], "env": {"A=B": "x"}})",
                       R"({"command": ["w"], "env": {"A": 1}})",
                       R"({"command": ["w"], "heavy": "yes"})",
                       R"({"command": ["w"], "colour": "red"})",
                       R"({"command": ["w"], "idle_timeout_s": 1e12})",
                       R"({"external": false})",
                       R"({"external": "yes"})",
                       R"({"external": true, "command": ["w"]})"};
  for (const char* body : bad) {
    auto spec = parse_function_spec("f", body);
    EXPECT_FALSE(spec.ok()) << body;
    EXPECT_EQ(spec.status().code(), ErrorCode::kInvalidValue) << body;
  }
}

TEST(FunctionSpec, Names) {
  EXPECT_TRUE(check_function_name("resnet-50_v1.2").ok());
  for (const char* name : {"", ".hidden", "a/b", "a b", "é", "a\nb", "a\x1b[2J"}) {
    EXPECT_FALSE(check_function_name(name).ok()) << name;
  }
  EXPECT_FALSE(check_function_name(std::string(129, 'a')).ok());
  EXPECT_TRUE(check_function_name(std::string(128, 'a')).ok());
}

TEST(Registry, KeepsFunctionsAcrossReopening) {
  const std::string state = temp_state();
  {
    auto registry = Registry::open(state);
    ASSERT_TRUE(registry.ok()) << registry.status();
    for (const char* name : {"a", "b", "c"}) {
      auto spec = parse_function_spec(name, R"({"command": ["w"], "slo_ms": 250})");
      ASSERT_TRUE(spec.ok());
      ASSERT_TRUE(registry->put(*spec).ok());
    }
    ASSERT_TRUE(registry->unload("b").ok());
    EXPECT_EQ(registry->unload("b").code(), ErrorCode::kNotFound);
    EXPECT_EQ(registry->find("b"), nullptr);
    ASSERT_NE(registry->find_unloaded("b"), nullptr);
  }
  // A temporary file left by a crash mid-write is not a registration.
  std::ofstream(state + "/functions/d.json.tmp") << "{\"comm";
  auto reopened = Registry::open(state);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  ASSERT_EQ(reopened->functions().size(), 2u);
  EXPECT_NE(reopened->find("a"), nullptr);
  EXPECT_EQ(reopened->find("b"), nullptr);
  EXPECT_EQ(reopened->find("c")->slo_ms, 250);
  // The unloaded one stays in the repository, with its registration, across the restart.
  ASSERT_EQ(reopened->unloaded().size(), 1u);
  ASSERT_NE(reopened->find_unloaded("b"), nullptr);
  EXPECT_EQ(reopened->find_unloaded("b")->slo_ms, 250);
  // Loading it again makes it loaded, on disk too.
  ASSERT_TRUE(reopened->put(*reopened->find_unloaded("b")).ok());
  EXPECT_EQ(reopened->find_unloaded("b"), nullptr);
  EXPECT_FALSE(fs::exists(state + "/functions/unloaded/b.json"));
  auto again = Registry::open(state);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->functions().size(), 3u);
  EXPECT_TRUE(again->unloaded().empty());
  // The files are the owner's only.
  struct stat st {};
  ASSERT_EQ(::stat((state + "/functions/a.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  fs::remove_all(state);
}

TEST(Registry, ACorruptFileStopsTheRouterWithItsName) {
  const std::string state = temp_state();
  fs::create_directories(state + "/functions");
  std::ofstream(state + "/functions/broken.json") << "{\"command\": [";
  auto registry = Registry::open(state);
  ASSERT_FALSE(registry.ok());
  EXPECT_NE(registry.status().message().find("broken.json"), std::string::npos)
      << registry.status();
  fs::remove_all(state);
}

TEST(ControlAddress, Forms) {
  auto unix_address = parse_control_address("unix:/run/hiber/control.sock");
  ASSERT_TRUE(unix_address.ok());
  EXPECT_FALSE(unix_address->tcp);
  auto bare = parse_control_address("/run/hiber/control.sock");
  ASSERT_TRUE(bare.ok());
  EXPECT_FALSE(bare->tcp);
  auto tcp = parse_control_address("tcp:127.0.0.1:7070");
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_TRUE(tcp->tcp);
  for (const char* bad : {"tcp:", "tcp:host", "tcp::80", "unix:", ""}) {
    EXPECT_FALSE(parse_control_address(bad).ok()) << bad;
  }
  EXPECT_FALSE(parse_control_address("unix:/" + std::string(200, 'x')).ok());
}

}  // namespace
}  // namespace hiber::router
