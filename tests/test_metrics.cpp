// Classification metrics against a hand computation (include/lstm/metrics.hpp).
#include <gtest/gtest.h>

#include "lstm/error.hpp"
#include "lstm/metrics.hpp"
#include "lstm/train.hpp"

using namespace lstm;

namespace {

// Targets/predictions over classes a, b, c, d:
//   (a,a) (a,a) (a,b) (b,b) (b,a) (b,d) (c,a) (c,b)
// c is never predicted; d is predicted once and never a target.
ConfusionMatrix example() {
  ConfusionMatrix m(4);
  const int64_t pairs[][2] = {{0, 0}, {0, 0}, {0, 1}, {1, 1}, {1, 0}, {1, 3}, {2, 0}, {2, 1}};
  for (const auto& p : pairs) m.add(p[0], p[1]);
  return m;
}

}  // namespace

TEST(Metrics, ConfusionCounts) {
  const ConfusionMatrix m = example();
  EXPECT_EQ(m.counts, (std::vector<std::vector<int64_t>>{{2, 1, 0, 0}, {1, 1, 0, 1}, {1, 1, 0, 0}, {0, 0, 0, 0}}));
  EXPECT_EQ(m.total(), 8);
  EXPECT_EQ(m.correct(), 3);
  ConfusionMatrix bad(2);
  EXPECT_THROW(bad.add(2, 0), Error);
  EXPECT_THROW(bad.add(0, -1), Error);
}

TEST(Metrics, PerClassPrecisionRecallF1ByHand) {
  const auto r = class_metrics(example(), {"a", "b", "c", "d"});
  ASSERT_EQ(r.size(), 4u);
  // a: tp 2, predicted 4, support 3.
  EXPECT_EQ(r[0].name, "a");
  EXPECT_EQ(r[0].support, 3);
  EXPECT_EQ(r[0].predicted, 4);
  EXPECT_DOUBLE_EQ(r[0].precision, 0.5);
  EXPECT_DOUBLE_EQ(r[0].recall, 2.0 / 3);
  EXPECT_NEAR(r[0].f1, 4.0 / 7, 1e-15);
  // b: tp 1, predicted 3, support 3.
  EXPECT_EQ(r[1].support, 3);
  EXPECT_EQ(r[1].predicted, 3);
  EXPECT_DOUBLE_EQ(r[1].precision, 1.0 / 3);
  EXPECT_DOUBLE_EQ(r[1].recall, 1.0 / 3);
  EXPECT_NEAR(r[1].f1, 1.0 / 3, 1e-15);
  // c: never predicted: precision 0/0 is defined as 0 (zero_division=0), recall 0/2.
  EXPECT_EQ(r[2].support, 2);
  EXPECT_EQ(r[2].predicted, 0);
  EXPECT_EQ(r[2].precision, 0.0);
  EXPECT_EQ(r[2].recall, 0.0);
  EXPECT_EQ(r[2].f1, 0.0);
  // d: predicted once, never a target: precision 0/1, recall 0/0 -> 0, F1 0.
  EXPECT_EQ(r[3].support, 0);
  EXPECT_EQ(r[3].predicted, 1);
  EXPECT_EQ(r[3].precision, 0.0);
  EXPECT_EQ(r[3].recall, 0.0);
  EXPECT_EQ(r[3].f1, 0.0);
  EXPECT_THROW(class_metrics(example(), {"a", "b"}), Error);
}

TEST(Metrics, PerfectAndEmpty) {
  ConfusionMatrix m(2);
  m.add(0, 0, 5);
  m.add(1, 1, 2);
  for (const auto& c : class_metrics(m, {"x", "y"})) {
    EXPECT_EQ(c.precision, 1.0);
    EXPECT_EQ(c.recall, 1.0);
    EXPECT_EQ(c.f1, 1.0);
  }
  for (const auto& c : class_metrics(ConfusionMatrix(2), {"x", "y"})) EXPECT_EQ(c.f1, 0.0);
}

TEST(Metrics, ReportShowsTableAndMatrix) {
  EvalResult r;
  r.task = "classify";
  r.data = "test.csv";
  r.count = 8;
  r.class_names = {"a", "b", "c", "d"};
  r.confusion = example();
  r.per_class = class_metrics(r.confusion, r.class_names);
  const std::string text = r.report();
  EXPECT_NE(text.find("precision"), std::string::npos) << text;
  EXPECT_NE(text.find("0.5714"), std::string::npos) << text;  // a's F1
  EXPECT_NE(text.find("confusion matrix (rows: target, columns: predicted)"), std::string::npos) << text;
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j["confusion"]["counts"][1], (std::vector<int64_t>{1, 1, 0, 1}));
  EXPECT_EQ(j["classes"][2]["class"], "c");
  EXPECT_EQ(j["classes"][2]["precision"], 0.0);
}
