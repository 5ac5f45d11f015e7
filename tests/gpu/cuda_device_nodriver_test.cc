// The CUDA backend on any machine: without a driver it must fail to create with a one-line reason
// (never crash), with the toolkit's stub library it must say so, and with a GPU it must find it.
// Also the pure topology helpers (sysfs parsing, bandwidth estimates), against a fake sysfs tree.
//
// Runs twice under ctest: as cuda_device_nodriver_test (whatever libcuda.so.1 the machine has),
// and as cuda_device_nodriver_stub_test with LD_LIBRARY_PATH pointing at a directory whose
// libcuda.so.1 is the toolkit's stub and HIBER_EXPECT_CUDA_STUB=1 (tests/gpu/CMakeLists.txt).
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/device/cuda_device.h"
#include "server/device/cuda_driver.h"
#include "server/device/cuda_topology.h"

namespace hiber::device {
namespace {

namespace fs = std::filesystem;
using ::testing::AnyOf;
using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;

bool expect_stub() {
  const char* v = std::getenv("HIBER_EXPECT_CUDA_STUB");
  return v != nullptr && std::string(v) == "1";
}

TEST(CreateCudaDevice, FailsWithOneLineReasonOrFindsGpus) {
  Result<std::unique_ptr<Device>> device = create_cuda_device({});
  if (device.ok()) {
    ASSERT_FALSE(expect_stub()) << "created a device on the stub library";
    EXPECT_EQ((*device)->backend_name(), "cuda");
    EXPECT_GE((*device)->gpu_count(), 1);
    std::cout << "CUDA device with " << (*device)->gpu_count() << " GPU(s)\n";
    return;
  }
  const Status& s = device.status();
  std::cout << "no CUDA device: " << s << "\n";
  EXPECT_THAT(s.code(), AnyOf(Eq(ErrorCode::kNoDevice), Eq(ErrorCode::kStubLibrary),
                              Eq(ErrorCode::kNotInitialized)))
      << s;
  EXPECT_FALSE(s.message().empty());
  EXPECT_THAT(s.message(), Not(HasSubstr("\n")));
  if (expect_stub()) {
    EXPECT_EQ(s.code(), ErrorCode::kStubLibrary) << s;
    EXPECT_THAT(s.message(), HasSubstr("stub"));
  }
}

TEST(CreateCudaDevice, GivesTheSameAnswerEveryTime) {
  // The driver is loaded once per process; a second attempt must neither crash nor differ.
  Result<std::unique_ptr<Device>> first = create_cuda_device({});
  Result<std::unique_ptr<Device>> second = create_cuda_device({});
  ASSERT_EQ(first.ok(), second.ok());
  if (!first.ok()) {
    EXPECT_EQ(first.status(), second.status());
  } else {
    EXPECT_EQ((*first)->gpu_count(), (*second)->gpu_count());
  }
}

TEST(CudaDriver, NeedsTheNewestVersionInTheEntryPointList) {
  // cuEventElapsedTime_v2 (12080) is the newest ABI the backend calls.
  EXPECT_EQ(cuda_driver::kRequiredDriverVersion, 12080);
}

// ---- Topology helpers ----

namespace topo = cuda_topology;

TEST(CudaTopology, NormalizesPciBusIds) {
  EXPECT_EQ(*topo::normalize_pci_bus_id("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*topo::normalize_pci_bus_id("00000000:3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(*topo::normalize_pci_bus_id("1:2:3.4"), "0001:02:03.4");
  for (const char* bad : {"", "3b:00.0", "0000:3b:00", "0000:3b:00.8", "0000:3b:20.0",
                          "0000:3g:00.0", "0000:3b:00.0 ", "000000000:3b:00.0"}) {
    Result<std::string> r = topo::normalize_pci_bus_id(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "' -> " << (r.ok() ? *r : "");
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidValue);
    }
  }
}

TEST(CudaTopology, ParsesSysfsLinkSpeeds) {
  EXPECT_DOUBLE_EQ(*topo::parse_link_speed_gts("16.0 GT/s PCIe"), 16.0);
  EXPECT_DOUBLE_EQ(*topo::parse_link_speed_gts("8 GT/s"), 8.0);
  EXPECT_DOUBLE_EQ(*topo::parse_link_speed_gts("2.5 GT/s PCIe"), 2.5);
  EXPECT_FALSE(topo::parse_link_speed_gts("Unknown").ok());
  EXPECT_FALSE(topo::parse_link_speed_gts("16.0 MB/s").ok());
  EXPECT_FALSE(topo::parse_link_speed_gts("").ok());
}

TEST(CudaTopology, EstimatesPcieBandwidthFromSpeedAndWidth) {
  EXPECT_NEAR(topo::pcie_link_gbps(2.5, 16), 4.0, 1e-9);      // PCIe 1.0 x16, 8b/10b
  EXPECT_NEAR(topo::pcie_link_gbps(5.0, 16), 8.0, 1e-9);      // PCIe 2.0 x16
  EXPECT_NEAR(topo::pcie_link_gbps(8.0, 16), 15.754, 1e-3);   // PCIe 3.0 x16, 128b/130b
  EXPECT_NEAR(topo::pcie_link_gbps(16.0, 16), 31.508, 1e-3);  // PCIe 4.0 x16
  EXPECT_NEAR(topo::pcie_link_gbps(32.0, 16), 63.015, 1e-3);  // PCIe 5.0 x16
  EXPECT_NEAR(topo::pcie_link_gbps(16.0, 8), 15.754, 1e-3);   // PCIe 4.0 x8
  EXPECT_NEAR(topo::pcie_link_gbps(64.0, 16), 121.0, 1e-3);   // PCIe 6.0 x16, FLIT
  EXPECT_NEAR(topo::kDefaultPcieGbps, topo::pcie_link_gbps(16.0, 16), 1e-9);
}

TEST(CudaTopology, FindsTheSwitchUpstreamPortTwoLevelsUp) {
  // Behind a switch: GPU <- downstream port <- upstream port (the shared uplink).
  EXPECT_EQ(topo::uplink_device_path(
                "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0"),
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0");
  // On a root port: its own link.
  EXPECT_EQ(topo::uplink_device_path("/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0"),
            "/sys/devices/pci0000:00/0000:00:03.0/0000:05:00.0");
  // Straight on the host bridge (as in many VMs): its own link.
  EXPECT_EQ(topo::uplink_device_path("/sys/devices/pci0000:00/0000:00:05.0"),
            "/sys/devices/pci0000:00/0000:00:05.0");
}

// A fake /sys with the layout real machines have: /sys/devices/... holds the tree and
// /sys/bus/pci/devices/<bus id> links into it.
class FakeSysfs {
 public:
  FakeSysfs() {
    std::string tmpl = (fs::temp_directory_path() / "hiber_sysfs_XXXXXX").string();
    root_ = mkdtemp(tmpl.data());
    fs::create_directories(root_ + "/bus/pci/devices");
  }
  ~FakeSysfs() { fs::remove_all(root_); }

  // A device at devices/<path>; `link` with its current/max link speed and width if given.
  void add(const std::string& path, const char* current_speed = nullptr, int width = 0,
           const char* max_speed = nullptr) {
    std::string dir = root_ + "/devices/" + path;
    fs::create_directories(dir);
    if (current_speed != nullptr) write(dir + "/current_link_speed", current_speed);
    if (width != 0) write(dir + "/current_link_width", std::to_string(width));
    if (max_speed != nullptr) write(dir + "/max_link_speed", max_speed);
  }
  // Registers a device by its bus id (the last path component), as a relative symlink.
  void link(const std::string& path) {
    std::string bus_id = fs::path(path).filename().string();
    fs::create_directory_symlink("../../../devices/" + path, root_ + "/bus/pci/devices/" + bus_id);
  }
  const std::string& root() const { return root_; }

 private:
  static void write(const std::string& file, const std::string& text) {
    std::ofstream(file) << text << "\n";
  }
  std::string root_;
};

TEST(CudaTopology, GroupsGpusBySharedPcieUplink) {
  FakeSysfs sys;
  // Switch A: upstream port 0000:01:00.0 (PCIe 4.0 x16) with GPUs 0 and 1 behind it.
  sys.add("pci0000:00/0000:00:01.0", "16.0 GT/s PCIe", 16, "16.0 GT/s PCIe");
  sys.add("pci0000:00/0000:00:01.0/0000:01:00.0", "16.0 GT/s PCIe", 16, "16.0 GT/s PCIe");
  const std::string gpu0 = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0";
  const std::string gpu1 = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0";
  sys.add(gpu0, "16.0 GT/s PCIe", 16);
  sys.add(gpu1, "16.0 GT/s PCIe", 16);
  // GPU 2 straight on a root port, PCIe 3.0 x16.
  const std::string gpu2 = "pci0000:00/0000:00:03.0/0000:05:00.0";
  sys.add(gpu2, "8.0 GT/s PCIe", 16, "8.0 GT/s PCIe");
  // Switch B idles its uplink at 2.5 GT/s; both ends can do 16 GT/s, so it counts as 16.
  sys.add("pci0000:80/0000:80:01.0", "16.0 GT/s PCIe", 16, "32.0 GT/s PCIe");
  sys.add("pci0000:80/0000:80:01.0/0000:81:00.0", "2.5 GT/s PCIe", 16, "16.0 GT/s PCIe");
  const std::string gpu3 = "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0";
  sys.add(gpu3, "2.5 GT/s PCIe", 16, "16.0 GT/s PCIe");
  // Switch C hides its uplink speed (as some VMs do): the GPU's own link stands in.
  sys.add("pci0000:90/0000:90:01.0/0000:91:00.0");
  const std::string gpu5 = "pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:00.0/0000:93:00.0";
  sys.add(gpu5, "32.0 GT/s PCIe", 8, "32.0 GT/s PCIe");
  for (const std::string& g : {gpu0, gpu1, gpu2, gpu3, gpu5}) sys.link(g);

  // GPU 4 has no sysfs entry at all.
  std::vector<std::string> bus_ids = {"0000:03:00.0", "0000:04:00.0", "0000:05:00.0",
                                      "0000:83:00.0", "0000:99:00.0", "0000:93:00.0"};
  topo::PcieLayout layout = topo::discover_pcie_layout(bus_ids, sys.root());

  EXPECT_EQ(layout.switch_of_gpu, (std::vector<int>{0, 0, 1, 2, 3, 4}));
  ASSERT_EQ(layout.switches.size(), 5u);
  EXPECT_NEAR(layout.switches[0].host_to_device_gbps, 31.508, 1e-3);
  EXPECT_NEAR(layout.switches[1].host_to_device_gbps, 15.754, 1e-3);
  EXPECT_NEAR(layout.switches[2].host_to_device_gbps, 31.508, 1e-3);
  EXPECT_NEAR(layout.switches[3].host_to_device_gbps, topo::kDefaultPcieGbps, 1e-9);
  EXPECT_NEAR(layout.switches[4].host_to_device_gbps, 31.508, 1e-3);  // PCIe 5.0 x8
  for (const PcieSwitchSpec& s : layout.switches) {
    EXPECT_EQ(s.host_to_device_gbps, s.device_to_host_gbps);
  }
  EXPECT_THAT(layout.uplink_paths[0], HasSubstr("0000:01:00.0"));
  EXPECT_THAT(layout.uplink_paths[1], HasSubstr("0000:05:00.0"));
  ASSERT_EQ(layout.notes.size(), 1u);
  EXPECT_THAT(layout.notes[0], HasSubstr("GPU 4"));
}

TEST(CudaTopology, WithoutSysfsEveryGpuGetsADefaultLinkOfItsOwn) {
  std::vector<std::string> bus_ids = {"0000:03:00.0", "0000:04:00.0"};
  topo::PcieLayout layout = topo::discover_pcie_layout(bus_ids, "/nonexistent-sysfs");
  EXPECT_EQ(layout.switch_of_gpu, (std::vector<int>{0, 1}));
  ASSERT_EQ(layout.switches.size(), 2u);
  EXPECT_EQ(layout.switches[0].host_to_device_gbps, topo::kDefaultPcieGbps);
  EXPECT_EQ(layout.notes.size(), 2u);
}

TEST(CudaTopology, OnlyNvLinkClassPeersAreLinksWithAnEstimate) {
  // NVLink-class (native atomics): the generation's total, shared out by rank.
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(9, 0, 0, true), 450.0);
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(9, 0, 1, true), 225.0);
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(8, 0, 0, true), 300.0);
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(7, 0, 0, true), 150.0);
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(10, 0, 0, true), 900.0);
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(9, 0, -1, true), 450.0);
  // Peers over PCIe (no native atomics), or GPUs with no NVLink: no link.
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(9, 0, 0, false), std::nullopt);
  EXPECT_EQ(topo::nvlink_bandwidth_estimate_gbps(8, 9, 0, true), std::nullopt);
  // Worse ranks never estimate more.
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_GE(topo::nvlink_bandwidth_estimate_gbps(9, 0, rank, true).value(),
              topo::nvlink_bandwidth_estimate_gbps(9, 0, rank + 1, true).value());
  }
}

TEST(CudaTopology, MakesModelKeysFromProductNames) {
  EXPECT_EQ(topo::model_key("NVIDIA H100 80GB HBM3"), "nvidia-h100-80gb-hbm3");
  EXPECT_EQ(topo::model_key("Tesla V100-SXM2-16GB"), "tesla-v100-sxm2-16gb");
  EXPECT_EQ(topo::model_key("  NVIDIA  H200 "), "nvidia-h200");
  EXPECT_EQ(topo::model_key(""), "gpu");
}

}  // namespace
}  // namespace hiber::device
