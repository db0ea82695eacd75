// Prometheus exposition of the engine and request metrics under SGLang's
// metric names (serving.md §3.6), so existing dashboards keep working.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dsv4 {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  std::string render(const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void observe_request(const RequestTimes& times, int64_t completion_tokens, bool aborted);
  std::string render(const EngineMetrics& engine, const std::string& model_name) const;

 private:
  mutable std::mutex mutex_;
  Histogram ttft_, e2e_, tpot_;
};

}  // namespace dsv4
