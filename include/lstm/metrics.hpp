// Classification metrics from a confusion matrix: per-class precision, recall, F1 and support.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lstm {

// counts[t][p]: how many targets of class t were predicted as class p (C x C, C >= 1).
struct ConfusionMatrix {
  std::vector<std::vector<int64_t>> counts;

  explicit ConfusionMatrix(int64_t classes = 0);
  int64_t classes() const { return static_cast<int64_t>(counts.size()); }
  // Throws when either id is outside [0, classes()).
  void add(int64_t target, int64_t predicted, int64_t n = 1);
  int64_t total() const;
  int64_t correct() const;  // the diagonal
};

struct ClassMetrics {
  std::string name;
  int64_t support = 0;    // targets of the class (its row's sum)
  int64_t predicted = 0;  // predictions of the class (its column's sum)
  // precision = tp / predicted, recall = tp / support, f1 = 2 p r / (p + r). A ratio whose
  // denominator is 0 (a class never predicted, never present, or p + r = 0) is defined as 0, as
  // scikit-learn's zero_division=0 does.
  double precision = 0, recall = 0, f1 = 0;
};

// One entry per class, in class-id order; `names` must have one name per class.
std::vector<ClassMetrics> class_metrics(const ConfusionMatrix& m, const std::vector<std::string>& names);

}  // namespace lstm
