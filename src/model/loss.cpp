#include "lstm/loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lstm/device.hpp"
#if LSTM_HAVE_CUDA
#include "core/cuda_rt.hpp"
#include "cuda/layers.hpp"
#endif

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

// Which rows count (not masked, not ignore_index); a counted target outside [0, c) throws.
std::vector<uint8_t> counted_rows(const int64_t* tg, int64_t n, int64_t c, int64_t ignore_index,
                                  const std::vector<uint8_t>& mask, int64_t& count) {
  std::vector<uint8_t> counted(static_cast<size_t>(n), 0);
  count = 0;
  for (int64_t r = 0; r < n; ++r) {
    if ((!mask.empty() && !mask[r]) || tg[r] == ignore_index) continue;
    LSTM_REQUIRE(tg[r] >= 0 && tg[r] < c, "softmax_cross_entropy: target " << tg[r] << " at row " << r
                                                                            << " is outside the classes [0, " << c
                                                                            << ") and is not ignore_index ("
                                                                            << ignore_index << ")");
    counted[r] = 1;
    ++count;
  }
  return counted;
}

// CUDA logits: one fused kernel pass, nothing synchronised (the result is pending until
// resolve()). Host targets are checked here exactly as on the CPU (the same errors) and go to the
// device as int32 (-1 = not counted) with the count known on the host. Device targets are not
// read by the host: the count is computed on the device, and a counted target outside [0, C)
// cannot throw; it makes the loss and its row's gradient NaN instead (documented in
// cuda/layers.hpp), which a guarded optimizer step then skips.
LossResult softmax_cross_entropy_gpu(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                     const std::vector<uint8_t>& mask) {
#if LSTM_HAVE_CUDA
  LSTM_REQUIRE(logits.dtype() == DType::F32,
               "softmax_cross_entropy: logits on the GPU must be F32, got " << dtype_name(logits.dtype()));
  const int64_t n = logits.size(0), c = logits.size(1);
  LossResult res;
  res.pending = true;
  res.grad = Tensor::empty(logits.shape(), DType::F32, Device::CUDA);
  res.stats = Tensor::empty({3}, DType::F64, Device::CUDA);
  const auto* x = static_cast<const float*>(logits.raw());
  auto* g = static_cast<float*>(res.grad.raw());
  auto* stats = static_cast<double*>(res.stats.raw());
  if (targets.device() == Device::CPU) {
    int64_t count = 0;
    std::vector<uint8_t> counted = counted_rows(targets.data<int64_t>(), n, c, ignore_index, mask, count);
    const int64_t* tg = targets.data<int64_t>();
    std::vector<int32_t> resolved(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) resolved[r] = counted[r] ? static_cast<int32_t>(tg[r]) : -1;
    // Freed at return into the arena's cache; stream order keeps it alive for the kernel.
    cuda::DeviceBuffer dev(std::max<size_t>(resolved.size() * sizeof(int32_t), 1));
    cuda::upload_async(dev.get(), resolved.data(), resolved.size() * sizeof(int32_t));
    cuda::softmax_cross_entropy(x, g, stats, n, c, dev.as<int32_t>(), count, nullptr, nullptr, ignore_index);
  } else {
    cuda::softmax_cross_entropy(x, g, stats, n, c, nullptr, 0, static_cast<const int64_t*>(targets.raw()),
                                mask.empty() ? nullptr : mask.data(), ignore_index);
  }
  return res;
#else
  (void)targets;
  (void)ignore_index;
  (void)mask;
  require_cuda("softmax_cross_entropy on CUDA logits");
  return {};
#endif
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
  if (logits.device() == Device::CUDA) return softmax_cross_entropy_gpu(logits, targets, ignore_index, mask);

  const Tensor host_targets = targets.device() == Device::CPU ? targets : targets.cpu();
  const int64_t* tg = host_targets.data<int64_t>();
  LossResult res;
  std::vector<uint8_t> counted = counted_rows(tg, n, c, ignore_index, mask, res.count);

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

LossResult regression_loss(const Tensor& predictions, const Tensor& targets, RegressionLoss kind, double delta) {
  LSTM_REQUIRE(predictions.defined() && predictions.dim() >= 1,
               "regression_loss: expected predictions [N, K], got "
                   << (predictions.defined() ? predictions.shape_str() : std::string("an undefined tensor")));
  LSTM_REQUIRE(is_floating(predictions.dtype()) && targets.defined() && is_floating(targets.dtype()),
               "regression_loss: expected floating predictions and targets, got "
                   << dtype_name(predictions.dtype()) << " and "
                   << (targets.defined() ? dtype_name(targets.dtype()) : "an undefined tensor"));
  LSTM_REQUIRE(targets.shape() == predictions.shape(), "regression_loss: the predictions are "
                                                           << predictions.shape_str() << " but the targets are "
                                                           << targets.shape_str());
  LSTM_REQUIRE(kind == RegressionLoss::MSE || (delta > 0 && std::isfinite(delta)),
               "regression_loss: the Huber delta must be positive and finite, got " << delta);
  const Tensor x = predictions.device() == Device::CPU ? predictions : predictions.cpu();
  const Tensor y = targets.device() == Device::CPU ? targets : targets.cpu();
  const int64_t n = x.numel();
  LossResult res;
  res.count = n;
  Tensor grad = Tensor::empty(x.shape(), x.dtype());
  const double inv = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = x.get(i) - y.get(i);
    double l, g;
    if (kind == RegressionLoss::MSE || std::abs(d) < delta) {
      l = kind == RegressionLoss::MSE ? d * d : 0.5 * d * d;
      g = kind == RegressionLoss::MSE ? 2 * d : d;
    } else {
      l = delta * (std::abs(d) - 0.5 * delta);
      g = d > 0 ? delta : -delta;
    }
    total += l;
    if (x.dtype() == DType::F64)
      grad.data<double>()[i] = g * inv;
    else
      grad.data<float>()[i] = static_cast<float>(g * inv);
  }
  res.loss = total * inv;
  res.grad = predictions.device() == Device::CPU ? grad : grad.to_device(predictions.device());
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
  // A GPU row is copied to the host (this waits for the engine stream).
  const bool host = logits.device() == Device::CPU;
  const Tensor src = host ? logits : logits.slice0(row, row + 1).cpu();
  const int64_t base = host ? row * c : 0;
  std::vector<double> p(static_cast<size_t>(c));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < c; ++j) {
    p[j] = src.get(base + j) / temperature;
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
