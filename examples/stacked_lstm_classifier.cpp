// "Several LSTM layers, a dense layer, a softmax output: how do I connect them?"
//
// Sequences of 2 features; the class says which feature has the larger sum over the sequence's
// valid steps (lengths vary). The network: a 2-layer LSTM (the first layer's output sequence
// feeds the second), the output at each sequence's last valid step, a dense layer with ReLU,
// and a dense layer whose softmax (fused with the cross-entropy loss) gives the class.
//
// `example_stacked_lstm_classifier --cuda` runs the same loop on the GPU: the model is placed
// there, batches are copied over, and the loss is read back only when it is printed.
#include <cstdio>
#include <string>

#include "lstm/loss.hpp"
#include "lstm/model.hpp"
#include "lstm/optim.hpp"

int run(lstm::Device device) {
  const int64_t T = 20, B = 32, F = 2, classes = 2;
  lstm::Rng rng(7);

  lstm::Model model;
  model.add(lstm::make_lstm({.hidden_size = 32, .num_layers = 2}))  // [T,B,2] -> [T,B,32]
      .add(lstm::make_last_step())                                   // -> [B,32] at each length-1
      .add(lstm::make_dense(16))                                     // -> [B,16]
      .add(lstm::make_activation("relu"))
      .add(lstm::make_dense(classes));                               // -> [B,2] logits
  model.build({lstm::SignalKind::Sequence, F});
  model.init(rng);
  lstm::Placement where;
  where.device = device;  // parameters move there; f32 math
  model.place(where);
  std::printf("%s\non %s\n", model.summary().c_str(), lstm::device_name(device));

  auto make_batch = [&](lstm::Tensor& x, std::vector<int64_t>& lengths, lstm::Tensor& y) {
    x = lstm::Tensor::zeros({T, B, F});
    y = lstm::Tensor::zeros({B}, lstm::DType::I64);
    lengths.assign(B, 0);
    for (int64_t b = 0; b < B; ++b) {
      lengths[b] = 5 + static_cast<int64_t>(rng.below(T - 4));
      double s0 = 0, s1 = 0;
      for (int64_t t = 0; t < lengths[b]; ++t) {
        float a = static_cast<float>(rng.normal()), c = static_cast<float>(rng.normal());
        x.data<float>()[(t * B + b) * F] = a;
        x.data<float>()[(t * B + b) * F + 1] = c;
        s0 += a;
        s1 += c;
      }
      y.data<int64_t>()[b] = s1 > s0;
    }
  };

  auto opt = lstm::make_adam();
  auto params = model.parameters();
  lstm::Tensor x, y;
  std::vector<int64_t> lengths;
  for (int step = 1; step <= 400; ++step) {
    make_batch(x, lengths, y);
    model.zero_grad();
    lstm::Act logits = model.forward({x.to_device(device), lengths}, /*training=*/true, rng);
    lstm::LossResult loss = lstm::softmax_cross_entropy(logits.data, y);
    model.backward({loss.grad, lengths});
    // Norm, clipping and the update without a host round trip (the update is skipped if the
    // norm is not finite).
    lstm::Tensor norm = lstm::grad_norm_tensor(params);
    lstm::clip_grad_norm_with(params, 1.0, norm);
    opt->step_guarded(params, 3e-3, norm);
    if (step % 50 == 0) {
      loss.resolve();  // on the GPU: reads the loss back (a no-op on the CPU)
      std::printf("step %d  loss %.4f  batch accuracy %.1f%%\n", step, loss.loss,
                  100.0 * static_cast<double>(loss.correct) / static_cast<double>(loss.count));
    }
  }
  int64_t correct = 0, total = 0;
  for (int k = 0; k < 10; ++k) {
    make_batch(x, lengths, y);
    lstm::LossResult r = lstm::softmax_cross_entropy(model.forward({x.to_device(device), lengths}, false, rng).data, y);
    r.resolve();
    correct += r.correct;
    total += r.count;
  }
  std::printf("held-out accuracy: %.1f%%\n", 100.0 * static_cast<double>(correct) / static_cast<double>(total));
  return 0;
}

int main(int argc, char** argv) {
  const bool cuda = argc > 1 && std::string(argv[1]) == "--cuda";
  try {
    return run(cuda ? lstm::Device::CUDA : lstm::Device::CPU);
  } catch (const lstm::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
