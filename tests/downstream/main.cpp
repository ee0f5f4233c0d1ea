// Runs the CPU reference LSTM through the installed public API and checks it against the same
// recurrence written out by hand: with every weight and bias equal, all hidden units are equal.
#include <cmath>
#include <cstdio>

#include "lstm/lstm.hpp"

int main() {
  const int64_t I = 3, H = 4, T = 5, B = 2;
  const double w = 0.1, x = 0.5;
  lstm::LstmSpec spec{.input_size = I, .hidden_size = H};
  auto be = lstm::make_lstm_backend(lstm::LstmOptions{}, spec, lstm::DType::F64, lstm::Device::CPU);
  auto weights = lstm::make_flat_weights(spec, be->flat_layout(lstm::DType::F64), lstm::DType::F64,
                                         lstm::Device::CPU);
  for (auto& t : weights) t.fill_(w);
  lstm::LstmInput in{lstm::Tensor::full({T, B, I}, x, lstm::DType::F64), {}, {}, {}};
  lstm::LstmOutput out = be->forward(weights, in, false, nullptr, nullptr, lstm::ExecContext::cpu());
  const double got = out.h_n.data<double>()[0];

  double h = 0, c = 0;
  for (int64_t t = 0; t < T; ++t) {
    const double a = w * I * x + w * H * h + 2 * w;
    const double s = 1 / (1 + std::exp(-a));
    c = s * c + s * std::tanh(a);
    h = s * std::tanh(c);
  }
  std::printf("downstream h_n=%.6f expected=%.6f backend=%s\n", got, h, be->name().c_str());
  return std::fabs(got - h) < 1e-12 ? 0 : 1;
}
