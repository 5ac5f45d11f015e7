// The timing model against Table 4 and Table 3.
#include <cmath>
#include <cstdlib>

#include "sim/calibration.h"
#include "sim/experiment_support.h"
#include "sim/experiments_internal.h"

namespace hiber::sim {
namespace {

double to_ms(Duration d) { return static_cast<double>(d) / kMillisecond; }

std::string with_error(Duration ours, Duration paper) {
  const double e = (to_ms(ours) - to_ms(paper)) / to_ms(paper);
  return str_cat(fmt(to_ms(ours), 1), " (", e >= 0 ? "+" : "", fmt(e * 100, 0), "%)");
}

}  // namespace

Result<ExperimentResult> experiment_calibration(const ExperimentOptions& options) {
  const PipelineOptions& pipeline = options.hiber.pipeline;
  const LinkOptions& links = options.hiber.links;
  ExperimentResult out;

  CsvTable table4({"model", "exec_ms", "model_mib", "paper_pcie_ms", "sim_pcie_ms",
                   "paper_nvlink_ms", "sim_nvlink_ms"});
  std::vector<std::vector<std::string>> rows4;
  double abs_error = 0;
  for (const Model& m : paper_models()) {
    const SwapLatency s = swap_latency(options.node, m, pipeline, links);
    table4.add({m.name, fmt(to_ms(m.exec), 1), std::to_string(m.model_bytes >> 20),
                fmt(to_ms(m.paper_swap_pcie), 1), fmt(to_ms(s.pcie), 2),
                fmt(to_ms(m.paper_swap_nvlink), 1), fmt(to_ms(s.nvlink), 2)});
    rows4.push_back({m.name, std::to_string(m.model_bytes >> 20), fmt(to_ms(m.exec), 0),
                     fmt(to_ms(m.paper_swap_pcie), 0), with_error(s.pcie, m.paper_swap_pcie),
                     fmt(to_ms(m.paper_swap_nvlink), 0),
                     with_error(s.nvlink, m.paper_swap_nvlink)});
    abs_error += std::abs(to_ms(s.pcie) - to_ms(m.paper_swap_pcie)) / to_ms(m.paper_swap_pcie);
    abs_error +=
        std::abs(to_ms(s.nvlink) - to_ms(m.paper_swap_nvlink)) / to_ms(m.paper_swap_nvlink);
  }
  HIBER_RETURN_IF_ERROR(table4.write(file_in(options, "calibration_table4.csv")));
  out.files.push_back("calibration_table4.csv");

  // Table 3: rows are measured, columns swapped concurrently on the neighbour GPU.
  const char* names[] = {"densenet169", "resnet152", "bertqa"};
  const double paper3[3][3] = {{27, 27, 27}, {31, 29, 43}, {166, 240, 149}};
  CsvTable table3({"model", "concurrent", "paper_ms", "sim_ms"});
  std::vector<std::vector<std::string>> rows3;
  double resnet_next_to_bert = 0;
  double bert_next_to_resnet = 0;
  for (int r = 0; r < 3; ++r) {
    const Model& row = paper_models()[*find_model(names[r])];
    std::vector<std::string> cells = {names[r]};
    for (int c = 0; c < 3; ++c) {
      const Model& column = paper_models()[*find_model(names[c])];
      const Duration d =
          contended_latency(options.node, row, r == c ? nullptr : &column, pipeline, links, 50);
      table3.add({names[r], r == c ? "none" : names[c], fmt(paper3[r][c], 0), fmt(to_ms(d), 2)});
      cells.push_back(str_cat(fmt(to_ms(d), 0), " (paper ", fmt(paper3[r][c], 0), ")"));
      if (r == 1 && c == 2) resnet_next_to_bert = to_ms(d);
      if (r == 2 && c == 1) bert_next_to_resnet = to_ms(d);
    }
    rows3.push_back(std::move(cells));
  }
  HIBER_RETURN_IF_ERROR(table3.write(file_in(options, "calibration_table3.csv")));
  out.files.push_back("calibration_table3.csv");

  out.paper =
      "Table 4: swap latencies alone (e.g. ResNet-152 25 ms over PCIe, 20 ms over NVLink); "
      "Table 3: ResNet-152 43 ms next to a Bert-qa swap, Bert-qa 240 ms next to ResNet-152";
  out.ours = str_cat("mean error ", pct(abs_error / (2 * paper_models().size())),
                     " over Table 4's 16 swap latencies; ", fmt(resnet_next_to_bert, 0), " and ",
                     fmt(bert_next_to_resnet, 0), " ms");
  out.markdown = str_cat(
      "## Calibration: the timing model against Table 4 and Table 3\n\n",
      "Swap latency of one request whose model is swapped in, alone on the node (Table 4): "
      "setup ",
      fmt(to_ms(pipeline.setup), 2),
      " ms, then the model's PyTorch segments over "
      "one PCIe switch (",
      options.node.pcie_switches.empty() ? 0 : options.node.pcie_switches[0].host_to_device_gbps,
      " GB/s) or the node's fastest NVLink, one transfer getting ", pct(links.transfer_efficiency),
      " of the link, computation pipelined behind ", options.hiber.pipeline.group_bytes >> 20,
      " MiB groups (docs/sim.md). Command: `", command_line("calibration"), "`.\n\n",
      markdown_table({"model", "blocks (MiB)", "resident (ms)", "Swap-PCIe paper", "Swap-PCIe ours",
                      "Swap-NVLink paper", "Swap-NVLink ours"},
                     rows4),
      "\nMean absolute error over both columns: ", pct(abs_error / (2 * paper_models().size())),
      ".\n\nTable 3: latency (ms) of the row's pipelined swap while the column's model is swapped "
      "into the neighbour GPU behind the same switch, back to back (diagonal: alone).\n\n",
      markdown_table({"model", "+ densenet169", "+ resnet152", "+ bertqa"}, rows3), "\n");
  return out;
}

}  // namespace hiber::sim
