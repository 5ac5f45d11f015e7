// A node's status report in pages (protocol 1.5): a status request may ask for a page of the
// functions list, so that a node with thousands of functions answers with replies of bounded
// size. A reader asks for pages until it has every function, then merges them into one status
// reply, read as before (hiberctl, the router, hiberd's /metrics).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "wire/message.h"

namespace hiber::wire {

// Functions per status page: with 256-byte ids a page stays well under 1 MiB.
inline constexpr uint32_t kStatusPageFunctions = 1000;

// Where the page after `page` (a ControlReply holding a NodeStatus) starts, or nullopt when
// `page` ends the list (a hiberd before 1.5 lists every function at once). kInvalidValue for a
// reply that is not a status, or one that lists nothing before the end (a page to ask forever).
Result<std::optional<uint64_t>> next_status_page(const Message& page);

// One status reply holding everything the first page has, with the functions of every page.
// REQUIRES: pages is not empty, and each page is a status reply.
Result<Message> merge_status_pages(const std::vector<Message>& pages);

}  // namespace hiber::wire
