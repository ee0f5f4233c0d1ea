// Classification metrics and the evaluation report.
#include "lstm/metrics.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "lstm/error.hpp"
#include "lstm/train.hpp"

namespace lstm {

ConfusionMatrix::ConfusionMatrix(int64_t classes) {
  LSTM_REQUIRE(classes >= 0, "ConfusionMatrix: the class count must be >= 0, got " << classes);
  counts.assign(static_cast<size_t>(classes), std::vector<int64_t>(static_cast<size_t>(classes), 0));
}

void ConfusionMatrix::add(int64_t target, int64_t predicted, int64_t n) {
  LSTM_REQUIRE(target >= 0 && target < classes() && predicted >= 0 && predicted < classes(),
               "ConfusionMatrix::add: target " << target << " and prediction " << predicted << " must be in [0, "
                                               << classes() << ")");
  counts[static_cast<size_t>(target)][static_cast<size_t>(predicted)] += n;
}

int64_t ConfusionMatrix::total() const {
  int64_t s = 0;
  for (const auto& row : counts)
    for (int64_t v : row) s += v;
  return s;
}

int64_t ConfusionMatrix::correct() const {
  int64_t s = 0;
  for (size_t i = 0; i < counts.size(); ++i) s += counts[i][i];
  return s;
}

std::vector<ClassMetrics> class_metrics(const ConfusionMatrix& m, const std::vector<std::string>& names) {
  const auto C = static_cast<size_t>(m.classes());
  LSTM_REQUIRE(names.size() == C, "class_metrics: " << names.size() << " class names for " << C << " classes");
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::vector<ClassMetrics> out(C);
  for (size_t c = 0; c < C; ++c) {
    ClassMetrics& r = out[c];
    r.name = names[c];
    for (size_t k = 0; k < C; ++k) {
      r.support += m.counts[c][k];
      r.predicted += m.counts[k][c];
    }
    const auto tp = static_cast<double>(m.counts[c][c]);
    r.precision = ratio(tp, static_cast<double>(r.predicted));
    r.recall = ratio(tp, static_cast<double>(r.support));
    r.f1 = ratio(2 * r.precision * r.recall, r.precision + r.recall);
  }
  return out;
}

}  // namespace lstm

// ---- the evaluation report (include/lstm/train.hpp) ----

namespace lstm {

nlohmann::json EvalResult::to_json() const {
  nlohmann::json j = {{"task", task},   {"data", data},         {"loss", loss},
                      {"accuracy", accuracy}, {"count", count}, {"unknown_inputs", unknown}};
  if (regression) {
    // The loss is on normalised targets; the errors are in the targets' original units.
    j.erase("accuracy");
    j["mse"] = mse;
    j["mae"] = mae;
    j["rmse"] = rmse;
  }
  if (!class_names.empty()) {
    nlohmann::json classes = nlohmann::json::array();
    for (const auto& c : per_class)
      classes.push_back({{"class", c.name},
                         {"precision", c.precision},
                         {"recall", c.recall},
                         {"f1", c.f1},
                         {"support", c.support},
                         {"predicted", c.predicted}});
    j["classes"] = classes;
    j["macro_f1"] = macro_f1;
    j["confusion"] = {{"labels", class_names}, {"rows", "target"}, {"columns", "predicted"}, {"counts", confusion.counts}};
  }
  return j;
}

std::string EvalResult::report() const {
  std::ostringstream os;
  os << "data: " << data << "\n";
  if (regression)
    os << "loss " << loss << " (normalised)  MSE " << mse << "  MAE " << mae << "  RMSE " << rmse
       << " (original units)  over " << count << " targets\n";
  else
    os << "loss " << loss << "  accuracy " << 100 * accuracy << "%  over " << count << " targets\n";
  if (unknown > 0)
    os << unknown << " input " << (task == "charlm" ? "character(s)" : "token(s)")
       << " not in the model's vocabulary were read as " << kUnknownToken << "\n";
  if (class_names.empty()) return os.str();
  size_t w = 5;  // "class"
  for (const auto& n : class_names) w = std::max(w, n.size());
  w = std::min<size_t>(w, 40);
  os << "\n" << std::left << std::setw(static_cast<int>(w)) << "class" << std::right << "  precision     recall         f1    support\n";
  os << std::fixed << std::setprecision(4);
  for (const auto& c : per_class)
    os << std::left << std::setw(static_cast<int>(w)) << c.name << std::right << std::setw(11) << c.precision
       << std::setw(11) << c.recall << std::setw(11) << c.f1 << std::setw(11) << c.support << "\n";
  os << std::left << std::setw(static_cast<int>(w)) << "macro avg" << std::right << std::setw(33) << macro_f1
     << std::setw(11) << count << "\n";
  os << std::defaultfloat << "\nconfusion matrix (rows: target, columns: predicted)\n";
  size_t cw = 1;
  for (const auto& n : class_names) cw = std::max(cw, std::min<size_t>(n.size(), 12));
  for (const auto& row : confusion.counts)
    for (int64_t v : row) cw = std::max(cw, std::to_string(v).size());
  os << std::setw(static_cast<int>(w)) << "";
  for (const auto& n : class_names) os << "  " << std::setw(static_cast<int>(cw)) << n.substr(0, 12);
  os << "\n";
  for (size_t t = 0; t < class_names.size(); ++t) {
    os << std::left << std::setw(static_cast<int>(w)) << class_names[t] << std::right;
    for (int64_t v : confusion.counts[t]) os << "  " << std::setw(static_cast<int>(cw)) << v;
    os << "\n";
  }
  return os.str();
}

}  // namespace lstm
