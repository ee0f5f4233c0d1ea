/* The C API from a C program (C99): the header is plain C, and liblstm_c's calls, the gradient
 * accumulation contract and the errors work with nothing of C++ on the caller's side. Values are
 * checked against the LSTM cell computed here by hand and against finite differences. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lstm/c_api.h"

#define CHECK(c)                                                                                     \
  do {                                                                                               \
    if (!(c)) {                                                                                      \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #c, lstm_last_error()); \
      return 1;                                                                                      \
    }                                                                                                \
  } while (0)

enum { I = 2, H = 3, T = 2 };
static double w_ih[4 * H * I], w_hh[4 * H * H], b_ih[4 * H], b_hh[4 * H];
static double x[T * I] = {0.5, -1.0, 0.25, 0.75}; /* [T, B=1, I] */

static double sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

/* sum(output) of the forward, by hand (h0 = c0 = 0); h/c of the last step into hn/cn. */
static double by_hand(double* hn, double* cn) {
  double h[H] = {0}, c[H] = {0}, total = 0;
  for (int t = 0; t < T; ++t) {
    double nh[H];
    for (int u = 0; u < H; ++u) {
      double g[4];
      for (int k = 0; k < 4; ++k) {
        const int row = k * H + u;
        double a = b_ih[row] + b_hh[row];
        for (int j = 0; j < I; ++j) a += w_ih[row * I + j] * x[t * I + j];
        for (int j = 0; j < H; ++j) a += w_hh[row * H + j] * h[j];
        g[k] = a;
      }
      c[u] = sigmoid(g[1]) * c[u] + sigmoid(g[0]) * tanh(g[2]);
      nh[u] = sigmoid(g[3]) * tanh(c[u]);
    }
    for (int u = 0; u < H; ++u) h[u] = nh[u], total += nh[u];
  }
  for (int u = 0; u < H; ++u) hn[u] = h[u], cn[u] = c[u];
  return total;
}

int main(void) {
  for (int i = 0; i < 4 * H * I; ++i) w_ih[i] = 0.05 * (i % 7) - 0.1;
  for (int i = 0; i < 4 * H * H; ++i) w_hh[i] = 0.03 * (i % 5) - 0.06;
  for (int i = 0; i < 4 * H; ++i) b_ih[i] = 0.01 * i, b_hh[i] = -0.02 * (i % 3);

  const lstm_spec spec = {I, H, 1, 0, 0, 1, 0, 0.0};
  const char* names = NULL;
  int64_t count = 0;
  CHECK(lstm_spec_param_names(&spec, &names, &count) == LSTM_OK);
  CHECK(count == 4 && strcmp(names, "weight_ih_l0\nweight_hh_l0\nbias_ih_l0\nbias_hh_l0") == 0);

  lstm_backend* b = NULL;
  lstm_backend_options opt = {"nope", NULL, NULL, "-", 0};
  CHECK(lstm_backend_create(&spec, LSTM_F64, LSTM_DEVICE_CPU, 0, &opt, &b) == LSTM_ERROR && b == NULL);
  CHECK(strstr(lstm_last_error(), "unknown LSTM backend 'nope'") != NULL);
  opt.algo = "reference";
  CHECK(lstm_backend_create(&spec, LSTM_F64, LSTM_DEVICE_CPU, 0, &opt, &b) == LSTM_OK && b != NULL);
  CHECK(strcmp(lstm_backend_info(b, "name"), "reference") == 0);

  const void* weights[4] = {w_ih, w_hh, b_ih, b_hh};
  double out[T * H], hn[H], cn[H], want_h[H], want_c[H];
  lstm_forward_args fa;
  memset(&fa, 0, sizeof fa);
  fa.steps = T;
  fa.batch = 1;
  fa.x = x;
  fa.weights = weights;
  fa.num_weights = 4;
  fa.output = out;
  fa.h_n = hn;
  fa.c_n = cn;
  lstm_saved* saved = NULL;
  CHECK(lstm_backend_forward(b, &fa, &saved) == LSTM_OK && saved != NULL);
  const double total = by_hand(want_h, want_c);
  double got_total = 0;
  for (int i = 0; i < T * H; ++i) got_total += out[i];
  CHECK(fabs(got_total - total) < 1e-12);
  for (int u = 0; u < H; ++u) CHECK(fabs(hn[u] - want_h[u]) < 1e-12 && fabs(cn[u] - want_c[u]) < 1e-12);

  /* Backward of sum(output): weight gradients are ADDED into d_weights (here pre-set to 1). */
  double ones[T * H], d_x[T * I], dw_ih[4 * H * I], dw_hh[4 * H * H], db_ih[4 * H], db_hh[4 * H];
  for (int i = 0; i < T * H; ++i) ones[i] = 1.0;
  for (int i = 0; i < 4 * H * I; ++i) dw_ih[i] = 1.0;
  for (int i = 0; i < 4 * H * H; ++i) dw_hh[i] = 1.0;
  for (int i = 0; i < 4 * H; ++i) db_ih[i] = 1.0, db_hh[i] = 1.0;
  void* d_weights[4] = {dw_ih, dw_hh, db_ih, db_hh};
  lstm_backward_args ba;
  memset(&ba, 0, sizeof ba);
  ba.weights = weights;
  ba.num_weights = 4;
  ba.d_output = ones;
  ba.d_x = d_x;
  ba.d_weights = d_weights;
  CHECK(lstm_backend_backward(b, saved, &ba) == LSTM_OK);
  CHECK(lstm_backend_backward(b, saved, &ba) == LSTM_ERROR);  /* once per saved state */
  CHECK(strstr(lstm_last_error(), "used by a backward already") != NULL);
  lstm_saved_destroy(saved);

  const double eps = 1e-6;
  double* params[4] = {w_ih, w_hh, b_ih, b_hh};
  double* grads[4] = {dw_ih, dw_hh, db_ih, db_hh};
  const int sizes[4] = {4 * H * I, 4 * H * H, 4 * H, 4 * H};
  double tmp_h[H], tmp_c[H];
  for (int p = 0; p < 4; ++p) {
    for (int i = 0; i < sizes[p]; i += 5) {
      const double keep = params[p][i];
      params[p][i] = keep + eps;
      const double up = by_hand(tmp_h, tmp_c);
      params[p][i] = keep - eps;
      const double down = by_hand(tmp_h, tmp_c);
      params[p][i] = keep;
      const double fd = (up - down) / (2 * eps);
      if (fabs(grads[p][i] - 1.0 - fd) > 1e-7) {
        fprintf(stderr, "parameter %d element %d: gradient %.12f (+1 accumulated), finite difference %.12f\n", p, i,
                grads[p][i] - 1.0, fd);
        return 1;
      }
    }
  }
  /* d_x against finite differences too. */
  for (int i = 0; i < T * I; ++i) {
    double* xm = x;
    const double keep = xm[i];
    xm[i] = keep + eps;
    const double up = by_hand(tmp_h, tmp_c);
    xm[i] = keep - eps;
    const double down = by_hand(tmp_h, tmp_c);
    xm[i] = keep;
    CHECK(fabs(d_x[i] - (up - down) / (2 * eps)) < 1e-7);
  }

  fa.x = NULL;
  CHECK(lstm_backend_forward(b, &fa, NULL) == LSTM_ERROR);
  CHECK(strstr(lstm_last_error(), "x and output must not be NULL") != NULL);
  lstm_backend_destroy(b);

  lstm_model* m = NULL;
  CHECK(lstm_model_load("/nonexistent/model.safetensors", LSTM_DEVICE_CPU, NULL, NULL, &m) == LSTM_ERROR && m == NULL);
  CHECK(strstr(lstm_last_error(), "does not exist") != NULL);
  CHECK(lstm_c_api_version() == LSTM_C_API_VERSION);
  printf("c_api_check: ok (engine %s)\n", lstm_version());
  return 0;
}
