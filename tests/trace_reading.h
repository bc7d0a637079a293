// Reading a Chrome trace that a rank wrote (core/trace.h), for the tests of what process
// groups draw in it: the spans of one name, each with the name of its lane.
#pragma once

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace weft::test {

struct TracedSpan {
  std::string lane;  // the name of its lane (thread_name)
  double ts = 0;     // microseconds since trace::start()
  double dur = 0;
};

// The complete spans ("X") named `name` in the trace file at `path`; an unreadable or
// invalid file throws (and fails the test).
inline std::vector<TracedSpan> traced_spans(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::pair<int, int>, std::string> lanes;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      lanes[{e.at("pid").get<int>(), e.at("tid").get<int>()}] = e.at("args").at("name").get<std::string>();
  std::vector<TracedSpan> spans;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("name") == name)
      spans.push_back({lanes[{e.at("pid").get<int>(), e.at("tid").get<int>()}], e.at("ts").get<double>(),
                       e.at("dur").get<double>()});
  return spans;
}

}  // namespace weft::test
