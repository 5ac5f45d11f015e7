// Conversion between NodeConfig and its Cap'n Proto form, for the handshake (which sends the
// node's topology to clients) and for anything else that carries a config in a message.
#pragma once

#include "common/node_config.capnp.h"
#include "common/node_config.h"

namespace hiber {

// Validates exactly as parse_node_config does.
Result<NodeConfig> node_config_from_capnp(config::NodeConfig::Reader reader);

// Writes `config`; GPUs that share a model share one gpuModels entry.
void node_config_to_capnp(const NodeConfig& config, config::NodeConfig::Builder builder);

}  // namespace hiber
