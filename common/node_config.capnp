# A GPU node: its GPUs, the PCIe switches they hang off, and the NVLink fabric between them.
#
# Config files are JSON with exactly these field names (capnp's JSON mapping); see
# configs/nodes/*.json. The same files drive the simulated GPU, the scheduler's topology model
# and hiber-sim. Bandwidths are GB/s (10^9 bytes per second) in one direction.
@0xc25f37f2d961d430;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("hiber::config");

struct NodeConfig {
  name @0 :Text;
  description @1 :Text;
  gpuModels @2 :List(GpuModel);
  gpus @3 :List(Gpu);             # index in this list = GPU ordinal
  pcieSwitches @4 :List(PcieSwitch);
  nvlinks @5 :List(NvLink);       # point-to-point links
  nvswitches @6 :List(NvSwitch);  # all-to-all fabrics
}

struct GpuModel {
  name @0 :Text;                  # the key Gpu.model refers to
  productName @1 :Text;           # what the device reports as its name
  memoryBytes @2 :UInt64;
  computeCapabilityMajor @3 :UInt32;
  computeCapabilityMinor @4 :UInt32;
  multiprocessors @5 :UInt32;
  memoryBandwidthGBps @6 :Float64;  # copies within one GPU
  clockRateKhz @7 :UInt32;
  memoryClockRateKhz @8 :UInt32;
  memoryBusWidthBits @9 :UInt32;
  l2CacheBytes @10 :UInt32;
}

struct Gpu {
  model @0 :Text;
  pcieSwitch @1 :UInt32;          # index into NodeConfig.pcieSwitches
  pciBusId @2 :Text;              # "0000:3b:00.0"; made up from the ordinal when empty
}

struct PcieSwitch {
  hostToDeviceGBps @0 :Float64;   # shared by every GPU behind this switch
  deviceToHostGBps @1 :Float64;
}

struct NvLink {
  gpuA @0 :UInt32;
  gpuB @1 :UInt32;
  bandwidthGBps @2 :Float64;      # per direction, all lanes between the pair together
}

struct NvSwitch {
  gpus @0 :List(UInt32);
  portBandwidthGBps @1 :Float64;  # each GPU's port into the switch, per direction
}
