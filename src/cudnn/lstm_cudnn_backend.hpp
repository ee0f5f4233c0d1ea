// What the cuDNN LSTM backend tells beyond LstmBackend (internal; CUDA builds only). The object
// make_cudnn_lstm_backend returns is a CudnnLstmBackend: dynamic_cast to read these.
#pragma once

#include <string>

#include "lstm/lstm.hpp"

namespace lstm {

class CudnnLstmBackend : public LstmBackend {
 public:
  // cuDNN's algorithm the last forward ran ("standard", "persist_static", ...; for cudnn_algo
  // "auto" the one picked); "" before the first forward.
  virtual std::string last_algo() const = 0;
  // One line per choice "auto" made so far: the case, each algorithm's time (or why it was left
  // out) and the pick.
  virtual std::string auto_log() const = 0;
  // How the last forward or backward ran cuDNN's work: "replayed" (a CUDA graph), "eager"
  // (issued call by call), "" (none yet).
  virtual std::string last_graph() const = 0;
  // One line per cuda_graphs decision: "auto"'s measurement and choice per shape, or why a shape
  // runs without graphs (a capture that failed, buffers that keep changing).
  virtual std::string graph_log() const = 0;
  // Whether the last forward's and the last backward's shapes have their cuda_graphs decision
  // ("auto" measures a few eager calls, then a few replays, before it keeps graphs or not): from
  // then on the same calls run the way they will keep running. Benchmarks warm up until it holds.
  virtual bool graphs_settled() const = 0;
  // Graphs captured and replays of captured graphs so far, over every shape. A steady loop
  // captures a few graphs and then only replays.
  struct GraphCounts {
    int64_t captures = 0, replays = 0;
  };
  virtual GraphCounts graph_counts() const = 0;
};

}  // namespace lstm
