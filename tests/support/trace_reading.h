// Reading a Chrome trace that a rank wrote (core/trace.h), for the tests of what process
// groups and pipelines draw in it: the spans (or instants) of one name, each with its lane.
#pragma once

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace weft::test {

struct TracedSpan {
  std::string lane;  // the name of its lane (thread_name)
  double ts = 0;     // microseconds since trace::start()
  double dur = 0;    // 0 for an instant
};

// The complete spans ("X") named `name` in a trace's JSON text, or with `instants` its instant
// events ("i") of that name; invalid JSON throws (and fails the test).
inline std::vector<TracedSpan> traced_events(const std::string& text, const std::string& name,
                                             bool instants = false) {
  const nlohmann::json trace = nlohmann::json::parse(text);
  std::map<std::pair<int, int>, std::string> lanes;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      lanes[{e.at("pid").get<int>(), e.at("tid").get<int>()}] = e.at("args").at("name").get<std::string>();
  std::vector<TracedSpan> spans;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == (instants ? "i" : "X") && e.at("name") == name)
      spans.push_back({lanes[{e.at("pid").get<int>(), e.at("tid").get<int>()}], e.at("ts").get<double>(),
                       instants ? 0.0 : e.at("dur").get<double>()});
  return spans;
}

// The complete spans named `name` in the trace file at `path`; an unreadable file throws.
inline std::vector<TracedSpan> traced_spans(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw std::runtime_error("cannot read the trace " + path);
  return traced_events(text.str(), name);
}

}  // namespace weft::test
