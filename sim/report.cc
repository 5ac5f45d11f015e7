#include "sim/report.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include <glog/logging.h>

namespace hiber::sim {
namespace {

std::string csv_field(const std::string& field) {
  if (field.find_first_of(",\"\n") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

}  // namespace

void CsvTable::add(std::vector<std::string> row) {
  CHECK_EQ(row.size(), header_.size()) << "CSV row width";
  rows_.push_back(std::move(row));
}

std::string CsvTable::text() const {
  std::string out;
  auto line = [&out](const std::vector<std::string>& fields) {
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i) out += ',';
      out += csv_field(fields[i]);
    }
    out += '\n';
  };
  line(header_);
  for (const auto& row : rows_) line(row);
  return out;
}

Status CsvTable::write(const std::string& path) const { return write_file(path, text()); }

std::string markdown_table(const std::vector<std::string>& header,
                           const std::vector<std::vector<std::string>>& rows) {
  std::string out = "|";
  for (const std::string& h : header) out += " " + h + " |";
  out += "\n|";
  for (size_t i = 0; i < header.size(); ++i) out += "---|";
  out += "\n";
  for (const auto& row : rows) {
    out += "|";
    for (const std::string& cell : row) out += " " + cell + " |";
    out += "\n";
  }
  return out;
}

std::string fmt(double value, int decimals) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  return buf;
}

std::string pct(double share) { return fmt(share * 100.0, 1) + "%"; }

Status write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return error(ErrorCode::kFileNotFound, path, ": cannot create");
  out << text;
  out.close();
  if (!out) return error(ErrorCode::kOperatingSystem, path, ": write failed");
  return Status();
}

}  // namespace hiber::sim
