#include "lstm/loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace lstm {

void LossResult::resolve() {
  if (!pending) return;
  Tensor h = stats.cpu();
  loss = h.get(0);
  count = static_cast<int64_t>(h.get(1));
  correct = static_cast<int64_t>(h.get(2));
  pending = false;
}

namespace {

// Below this many logits a parallel region costs more than the rows it would split.
constexpr int64_t kParallelMin = 1 << 14;

// Per-row results are kept so that the mean is summed in row order: the loss is then the same
// bit for bit whatever the thread count.
template <class T>
void cross_entropy_rows(const T* x, const int64_t* targets, const std::vector<uint8_t>& counted, T* grad,
                        int64_t n, int64_t c, double inv_count, std::vector<double>& row_loss,
                        std::vector<uint8_t>& row_correct) {
#pragma omp parallel for if (n * c >= kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    const T* xr = x + r * c;
    T* gr = grad + r * c;
    if (!counted[r]) {
      for (int64_t j = 0; j < c; ++j) gr[j] = T(0);
      continue;
    }
    // The first maximum, as torch.argmax picks on ties.
    int64_t arg = 0;
    for (int64_t j = 1; j < c; ++j)
      if (xr[j] > xr[arg]) arg = j;
    const double mx = static_cast<double>(xr[arg]);
    double sum = 0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(xr[j]) - mx);
    const int64_t t = targets[r];
    row_loss[r] = mx + std::log(sum) - static_cast<double>(xr[t]);
    row_correct[r] = arg == t;
    const double scale = inv_count / sum;
    for (int64_t j = 0; j < c; ++j)
      gr[j] = static_cast<T>(std::exp(static_cast<double>(xr[j]) - mx) * scale - (j == t ? inv_count : 0.0));
  }
}

}  // namespace

LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                 const std::vector<uint8_t>& mask) {
  LSTM_REQUIRE(logits.defined() && logits.dim() == 2,
               "softmax_cross_entropy: expected logits [N, C], got "
                   << (logits.defined() ? logits.shape_str() : std::string("an undefined tensor")));
  LSTM_REQUIRE(logits.dtype() == DType::F32 || logits.dtype() == DType::F64,
               "softmax_cross_entropy: expected F32 or F64 logits, got " << dtype_name(logits.dtype()));
  const int64_t n = logits.size(0), c = logits.size(1);
  LSTM_REQUIRE(c > 0, "softmax_cross_entropy: logits " << logits.shape_str() << " have no classes");
  LSTM_REQUIRE(targets.defined() && targets.dtype() == DType::I64 && targets.dim() == 1 && targets.size(0) == n,
               "softmax_cross_entropy: expected targets I64 [" << n << "], got "
                   << (targets.defined() ? std::string(dtype_name(targets.dtype())) + " " + targets.shape_str()
                                         : std::string("an undefined tensor")));
  LSTM_REQUIRE(mask.empty() || static_cast<int64_t>(mask.size()) == n,
               "softmax_cross_entropy: expected a mask of " << n << " rows, got " << mask.size());

  const int64_t* tg = targets.data<int64_t>();
  std::vector<uint8_t> counted(static_cast<size_t>(n), 0);
  LossResult res;
  for (int64_t r = 0; r < n; ++r) {
    if ((!mask.empty() && !mask[r]) || tg[r] == ignore_index) continue;
    LSTM_REQUIRE(tg[r] >= 0 && tg[r] < c, "softmax_cross_entropy: target " << tg[r] << " at row " << r
                                                                            << " is outside the classes [0, " << c
                                                                            << ") and is not ignore_index ("
                                                                            << ignore_index << ")");
    counted[r] = 1;
    ++res.count;
  }

  res.grad = Tensor::empty(logits.shape(), logits.dtype());
  const double inv_count = res.count > 0 ? 1.0 / static_cast<double>(res.count) : 0.0;
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
  std::vector<uint8_t> row_correct(static_cast<size_t>(n), 0);
  if (logits.dtype() == DType::F64)
    cross_entropy_rows(logits.data<double>(), tg, counted, res.grad.data<double>(), n, c, inv_count, row_loss,
                       row_correct);
  else
    cross_entropy_rows(logits.data<float>(), tg, counted, res.grad.data<float>(), n, c, inv_count, row_loss,
                       row_correct);
  double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    total += row_loss[r];
    res.correct += row_correct[r];
  }
  res.loss = total * inv_count;
  return res;
}

std::vector<double> softmax_row(const Tensor& logits, int64_t row, double temperature) {
  LSTM_REQUIRE(logits.defined() && logits.dim() == 2,
               "softmax_row: expected logits [N, C], got "
                   << (logits.defined() ? logits.shape_str() : std::string("an undefined tensor")));
  LSTM_REQUIRE(row >= 0 && row < logits.size(0),
               "softmax_row: row " << row << " is outside [0, " << logits.size(0) << ")");
  LSTM_REQUIRE(temperature > 0 && std::isfinite(temperature),
               "softmax_row: temperature must be positive and finite, got " << temperature);
  const int64_t c = logits.size(1);
  std::vector<double> p(static_cast<size_t>(c));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < c; ++j) {
    p[j] = logits.get(row * c + j) / temperature;
    mx = std::max(mx, p[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < c; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  for (double& v : p) v /= sum;
  return p;
}

}  // namespace lstm
