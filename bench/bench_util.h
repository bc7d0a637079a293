// Small helpers for the benchmark executables: timing medians, JSON output, and running
// a PyTorch reference script from bench/reference/ side by side.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace weft::bench {

// The median of `v` (the upper one of an even count; 0 when empty).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median over `rounds` of the time per call of `body`, in nanoseconds; each round runs
// `calls` calls. A warm-up round runs first.
template <class Body>
double median_ns_per_call(int rounds, int calls, Body&& body) {
  for (int i = 0; i < calls; ++i) body();
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) body();
    auto stop = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

// Flat JSON object of named numbers and strings, written in insertion order.
class JsonWriter {
 public:
  void add(const std::string& key, double value) {
    std::ostringstream out;
    out << value;
    entries_.emplace_back(key, out.str());
  }
  void add(const std::string& key, const std::string& value) { entries_.emplace_back(key, "\"" + value + "\""); }
  bool write(const std::string& path) const {
    std::ofstream out(path);
    out << "{\n";
    for (size_t i = 0; i < entries_.size(); ++i)
      out << "  \"" << entries_[i].first << "\": " << entries_[i].second << (i + 1 < entries_.size() ? ",\n" : "\n");
    out << "}\n";
    return static_cast<bool>(out);
  }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

// Reads a flat JSON object of numbers (what the reference scripts write), then deletes
// the file.
inline std::map<std::string, double> read_flat_json(const std::string& json) {
  std::map<std::string, double> values;
  std::ifstream in(json);
  std::string line;
  while (std::getline(in, line)) {
    auto q1 = line.find('"'), q2 = line.find('"', q1 + 1), colon = line.find(':', q2 + 1);
    if (q1 == std::string::npos || q2 == std::string::npos || colon == std::string::npos) continue;
    std::string value = line.substr(colon + 1);
    if (value.find('"') != std::string::npos) continue;
    values[line.substr(q1 + 1, q2 - q1 - 1)] = std::strtod(value.c_str(), nullptr);
  }
  std::remove(json.c_str());
  return values;
}

// The Python that has PyTorch: $WEFT_PYTHON, else the first of python3 and
// /usr/bin/python3 (Debian's python3-torch) that can import torch; "" if none.
inline std::string reference_python() {
  if (const char* env = std::getenv("WEFT_PYTHON")) return env;
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    std::string probe = std::string(candidate) + " -c 'import torch' > /dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return candidate;
  }
  return "";
}

// Runs `<python> bench/reference/<script> --json <tmp> <args>` and returns its numbers
// (flat JSON of numbers); empty when Python or PyTorch is missing.
inline std::map<std::string, double> run_reference(const std::string& script, const std::string& args = "") {
  std::map<std::string, double> values;
  std::string python = reference_python();
  if (python.empty()) return values;
  std::string json = "/tmp/weft_reference_" + std::to_string(::getpid()) + ".json";
  std::string command = python + " " WEFT_SOURCE_DIR "/bench/reference/" + script + " --json " + json + " " + args +
                        " > /dev/null 2>&1";
  if (std::system(command.c_str()) != 0) return values;
  return read_flat_json(json);
}

// Runs a reference executable `<program> --json <tmp>` that sits next to this one, if it
// was built, and returns its numbers; empty otherwise.
inline std::map<std::string, double> run_executable_reference(const std::string& self_path, const std::string& name) {
  std::string dir = self_path.substr(0, self_path.find_last_of('/') + 1);
  std::string program = dir + name;
  std::map<std::string, double> values;
  if (::access(program.c_str(), X_OK) != 0) return values;
  std::string json = "/tmp/weft_reference_" + std::to_string(::getpid()) + ".json";
  if (std::system((program + " --json " + json + " > /dev/null 2>&1").c_str()) != 0) return values;
  return read_flat_json(json);
}

}  // namespace weft::bench
