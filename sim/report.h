// Writing results: CSV files for the plots, and Markdown tables for docs/evaluation.md.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace hiber::sim {

// A CSV table built in memory and written in one go. Fields are written as given; a field
// holding a comma, a quote or a newline is quoted.
class CsvTable {
 public:
  explicit CsvTable(std::vector<std::string> header) : header_(std::move(header)) {}
  // REQUIRES: as many fields as the header.
  void add(std::vector<std::string> row);
  std::string text() const;
  Status write(const std::string& path) const;
  size_t rows() const { return rows_.size(); }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// A Markdown table.
std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows);

// Fixed-point formatting: fmt(0.8123, 2) == "0.81"; +inf prints as "inf".
std::string fmt(double value, int decimals);
// A share as a percentage: pct(0.8123) == "81.2%".
std::string pct(double share);

Status write_file(const std::string& path, const std::string& text);

}  // namespace hiber::sim
