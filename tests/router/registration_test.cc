// tools/registration.h: the JSON `hiberctl load` sends, from a file and flags.
#include "tools/registration.h"

#include <gtest/gtest.h>

namespace hiber::tools {
namespace {

using nlohmann::json;
using Words = std::vector<std::string>;

TEST(SplitCommand, WordsAndQuotes) {
  EXPECT_EQ(*split_command("python3 worker.py"), (Words{"python3", "worker.py"}));
  EXPECT_EQ(*split_command("  a\t b  "), (Words{"a", "b"}));
  EXPECT_EQ(*split_command("python3 'my worker.py' --x=\"a b\""),
            (Words{"python3", "my worker.py", "--x=a b"}));
  EXPECT_EQ(*split_command(R"(a\ b 'c\d' "e\"f" '')"), (Words{"a b", "c\\d", "e\"f", ""}));
  EXPECT_EQ(*split_command(""), Words{});
  EXPECT_FALSE(split_command("'open").ok());
  EXPECT_FALSE(split_command("\"open").ok());
  EXPECT_FALSE(split_command("end\\").ok());
}

TEST(ParseEnv, Entries) {
  auto env = parse_env("A=1,B=x=y,,EMPTY=");
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(*env, (std::map<std::string, std::string>{{"A", "1"}, {"B", "x=y"}, {"EMPTY", ""}}));
  EXPECT_FALSE(parse_env("A").ok());
  EXPECT_FALSE(parse_env("=1").ok());
}

TEST(BuildRegistration, FromFlags) {
  RegistrationFlags f;
  f.command = "/bin/worker --model 'a b'";
  f.env = "CUDA_MODULE_LOADING=LAZY,X=1";
  f.slo_ms = 80;
  f.max_instances = 2;
  f.stateful = false;
  f.heavy = true;
  auto r = build_registration(nullptr, f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, json::parse(R"({"command": ["/bin/worker", "--model", "a b"],
                                "env": {"CUDA_MODULE_LOADING": "LAZY", "X": "1"},
                                "slo_ms": 80.0, "max_instances": 2, "stateful": false,
                                "heavy": true})"));
}

TEST(BuildRegistration, FlagsOverAFile) {
  const json file = json::parse(R"({"command": ["w"], "env": {"A": "file", "B": "file"},
                                    "slo_ms": 100, "percentile": 0.99, "shim": true})");
  RegistrationFlags f;
  f.env = "A=flag";
  f.slo_ms = 50;
  f.shim = false;
  auto r = build_registration(file, f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, json::parse(R"({"command": ["w"], "env": {"A": "flag", "B": "file"},
                                "slo_ms": 50.0, "percentile": 0.99, "shim": false})"));
}

TEST(BuildRegistration, NeedsACommand) {
  RegistrationFlags f;
  f.slo_ms = 50;
  EXPECT_EQ(build_registration(nullptr, f).status().code(), ErrorCode::kInvalidValue);
  EXPECT_FALSE(build_registration(json::parse(R"({"command": []})"), {}).ok());
  EXPECT_FALSE(build_registration(json::parse(R"({"command": "w"})"), {}).ok());
  EXPECT_FALSE(build_registration(json::parse(R"({"command": ["w", 1]})"), {}).ok());
  EXPECT_FALSE(build_registration(json::parse(R"([1])"), {}).ok());
  EXPECT_FALSE(build_registration(json::parse(R"({"command": ["w"], "env": 3})"),
                                  RegistrationFlags{.env = "A=1"})
                   .ok());
}

// An external function's workers attach by themselves: no command, and none allowed.
TEST(BuildRegistration, ExternalHasNoCommand) {
  RegistrationFlags f;
  f.external = true;
  f.concurrency = 2;
  auto built = build_registration(nullptr, f);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(*built, json::parse(R"({"external": true, "concurrency": 2})"));
  EXPECT_TRUE(build_registration(json::parse(R"({"external": true})"), {}).ok());
  RegistrationFlags both;
  both.external = true;
  both.command = "w";
  EXPECT_EQ(build_registration(nullptr, both).status().code(), ErrorCode::kInvalidValue);
  EXPECT_FALSE(build_registration(json::parse(R"({"external": false})"), {}).ok());
}

}  // namespace
}  // namespace hiber::tools
