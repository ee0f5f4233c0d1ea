/* lstm-engine's C API (liblstm_c.so): the LSTM op and trained models for callers that are not
 * C++, e.g. the Python package (python/lstm_engine, through ctypes), so that no binary is tied
 * to one Python ABI. Plain C: opaque handles, raw pointers, no exception crosses it.
 *
 * Errors: every function that can fail returns an int status, LSTM_OK (0) or LSTM_ERROR (1); the
 * message (lstm::Error's text, e.g. a backend's "cannot run this case: ...") is then
 * lstm_last_error()'s, kept per thread until the thread's next failing call.
 * Strings returned as `const char*` belong to the library and stay valid until the calling
 * thread's next call of the same function.
 *
 * Memory is the caller's: forward and backward read inputs and weights where they are and write
 * their results into buffers the caller gives (contiguous, row-major, of the call's dtype and
 * device). On a GPU every copy and kernel is issued on the caller's stream (`stream`, a
 * cudaStream_t; NULL is the legacy default stream), in stream order after what the caller issued
 * before, and nothing waits for the GPU: the results are ready in stream order when a call
 * returns. Shapes follow lstm/lstm.hpp (T steps, B batch, Hout = proj_size or hidden_size,
 * D = 2 if bidirectional, L layers):
 *   x [T, B, input_size] ([B, T, input_size] when batch_first), output likewise with D*Hout
 *   h0, h_n [L*D, B, Hout]; c0, c_n [L*D, B, hidden_size]
 *   weights: nn.LSTM's parameters in nn.LSTM's order (lstm_spec_param_names), each a contiguous
 *   tensor of nn.LSTM's shape.
 */
#ifndef LSTM_C_API_H
#define LSTM_C_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LSTM_OK 0
#define LSTM_ERROR 1

/* lstm::DType and lstm::Device, same values. */
enum lstm_dtype { LSTM_F64 = 0, LSTM_F32 = 1, LSTM_BF16 = 2, LSTM_F16 = 3, LSTM_I64 = 4, LSTM_I32 = 5, LSTM_U8 = 6 };
enum lstm_device { LSTM_DEVICE_CPU = 0, LSTM_DEVICE_CUDA = 1 };

/* The version of this C API (bumped when a signature changes) and of the engine. */
#define LSTM_C_API_VERSION 1
int lstm_c_api_version(void);
const char* lstm_version(void);
/* The calling thread's last error message ("" when none). */
const char* lstm_last_error(void);
/* 1 when this build has CUDA and a usable GPU, else 0 (lstm_cuda_unavailable_reason says why). */
int lstm_cuda_available(void);
const char* lstm_cuda_unavailable_reason(void);
/* The backend registry as JSON: [{"name", "algo", "summary", "baseline", "variable_lengths",
 * "initial_state"}, ...] in the registry's order. */
const char* lstm_backends_json(void);

/* LstmSpec. bidirectional, bias, batch_first: 0 or 1. */
typedef struct lstm_spec {
  int64_t input_size;
  int64_t hidden_size;
  int64_t num_layers;
  int64_t proj_size; /* 0: none */
  int32_t bidirectional;
  int32_t bias;
  int32_t batch_first;
  double dropout;
} lstm_spec;

/* nn.LSTM's parameter names, newline-separated, in order; the number of them in *count. */
int lstm_spec_param_names(const lstm_spec* spec, const char** names, int64_t* count);

/* ---- The LSTM op ---- */
typedef struct lstm_backend lstm_backend;
typedef struct lstm_saved lstm_saved;

/* How a backend is made (LstmOptions). Strings may be NULL for the defaults. */
typedef struct lstm_backend_options {
  const char* algo;        /* a registry row ("reference", "onednn", "cudnn", "cudnn:standard", "fused", ...) or
                              "auto" (the default: fastest by measurement) */
  const char* cudnn_algo;  /* "heuristic" (default), "standard", ..., "auto" */
  const char* cuda_graphs; /* "auto" (default), "on", "off" */
  const char* auto_cache;  /* Algo::Auto's choice file ("": the default, "-": none) */
  int32_t allow_tf32;      /* F32 data may use TF32 tensor cores */
} lstm_backend_options;

/* A backend instance for spec, dtype (the data's: x, weights, outputs, gradients) and device
 * (device_index: the CUDA ordinal). Fails with the registry's reason when the chosen backend
 * cannot run the case. Not thread-safe: one instance is used by one thread at a time. */
int lstm_backend_create(const lstm_spec* spec, int dtype, int device, int device_index,
                        const lstm_backend_options* options, lstm_backend** out);
void lstm_backend_destroy(lstm_backend* b);
/* "name": the row it came from (e.g. "reference", "auto"); "last_run": how its last call ran;
 * "log": its decisions by measurement; "settled": "1" when the decisions for the shapes of its
 * last calls are made (benchmarks warm up until then), else "0". NULL for an unknown key. */
const char* lstm_backend_info(lstm_backend* b, const char* key);
/* The flat weight layout the backend uses weights in place from (LstmBackend::flat_layout):
 * *bytes and, when offsets is not NULL, one byte offset per parameter. *bytes = 0: none (weights
 * are read where they are). */
int lstm_backend_flat_layout(lstm_backend* b, size_t* bytes, size_t* offsets, int64_t count);

/* A memory allocator of the caller's for the GPU memory a call allocates (outputs kept in saved
 * state, workspaces): PyTorch's caching allocator, so that memory used by a call captured into a
 * torch.cuda.graph lives in the graph's pool. alloc returns NULL on failure; free may be called
 * later, on another thread (when a saved state or a backend is destroyed). NULL: the engine's
 * own caching arena. */
typedef struct lstm_allocator {
  void* (*alloc)(void* ctx, size_t bytes, void* stream);
  void (*free)(void* ctx, void* ptr);
  void* ctx;
} lstm_allocator;

typedef struct lstm_forward_args {
  int64_t steps, batch;    /* T and B */
  const void* x;
  const int64_t* lengths;  /* B values in [1, T], or NULL: every sequence has T steps */
  const void* h0;          /* NULL: zeros */
  const void* c0;          /* NULL: zeros */
  const void* const* weights;
  int64_t num_weights;
  int32_t training;        /* dropout between layers when spec.dropout > 0 */
  uint64_t seed;           /* of the dropout masks */
  void* output;            /* out: [T, B, D*Hout] (or batch-first) */
  void* h_n;               /* out, or NULL */
  void* c_n;               /* out, or NULL */
  void* stream;            /* cudaStream_t on a GPU */
  const lstm_allocator* allocator; /* NULL: the engine's arena */
} lstm_forward_args;

/* One forward. saved == NULL: inference; otherwise *saved receives what backward needs (free it
 * with lstm_saved_destroy, after the backward or instead of it). A saved state may point at the
 * caller's x, h0, c0 and weights: keep them alive and unchanged until its backward. */
int lstm_backend_forward(lstm_backend* b, const lstm_forward_args* args, lstm_saved** saved);

typedef struct lstm_backward_args {
  const void* const* weights;  /* as in the forward */
  int64_t num_weights;
  const void* d_output;        /* gradient of the loss w.r.t. output, or NULL (zero) */
  const void* d_h_n;           /* or NULL */
  const void* d_c_n;           /* or NULL */
  void* d_x;                   /* out: shape of x, or NULL (not wanted) */
  void* d_h0;                  /* out, or NULL (also when the forward had no h0) */
  void* d_c0;                  /* out, or NULL */
  void* const* d_weights;      /* ADDED INTO (aligned with weights): pass zeroed buffers for the gradients alone */
  void* stream;
  const lstm_allocator* allocator;
} lstm_backward_args;

/* The backward of the training forward that made `saved`; once per saved state. */
int lstm_backend_backward(lstm_backend* b, lstm_saved* saved, const lstm_backward_args* args);
void lstm_saved_destroy(lstm_saved* s);

/* ---- Trained models (lstm train's model.safetensors, or a run folder) ---- */
typedef struct lstm_model lstm_model;
typedef struct lstm_tensor lstm_tensor;

/* Loads a model file or run folder (resolve_model_path) onto device with precision ("f32",
 * "tf32", "bf16", "f16"; "f64" on the CPU) and LSTM algo (NULL: "auto"). */
int lstm_model_load(const char* path, int device, const char* precision, const char* algo, lstm_model** out);
void lstm_model_destroy(lstm_model* m);
/* JSON: {"path", "task", "model" (the architecture), "metadata" (the file's), "input": {"kind",
 * "features"}, "output": {"kind", "features"}, "num_parameters"}. */
const char* lstm_model_info(lstm_model* m);
/* The network's forward (inference) on a host input: tokens (I64 [T, B]) or features (F32 or
 * F64 [T, B, F]), lengths (B values, or NULL). *out: the model's output on the host (F32):
 * [T, B, K] or [B, K]. Task pre/post-processing (normalisation, softmax) is not applied: see
 * lstm_predict. */
int lstm_model_forward(lstm_model* m, const void* x, int dtype, const int64_t* shape, int64_t ndim,
                       const int64_t* lengths, lstm_tensor** out);
int64_t lstm_tensor_ndim(const lstm_tensor* t);
int64_t lstm_tensor_dim(const lstm_tensor* t, int64_t i);
int lstm_tensor_dtype(const lstm_tensor* t);
const void* lstm_tensor_data(const lstm_tensor* t); /* host data */
void lstm_tensor_destroy(lstm_tensor* t);

/* `lstm eval`: EvalResult::to_json() (loss, accuracy, per-class metrics, ...). data_path NULL or
 * "": the held-out split recorded in the model; batch_size/seq_len 0: the training values. */
int lstm_evaluate(const char* model_path, const char* data_path, int64_t batch_size, int64_t seq_len, int device,
                  const char* precision, const char* algo, const char** result_json);
/* `lstm predict` into output_path (NULL or "": returned in *text instead); format "csv", "jsonl" or
 * NULL (from the file name). *result_json: {"task", "format", "rows", "unknown"}. */
int lstm_predict(const char* model_path, const char* data_path, const char* output_path, const char* format,
                 int64_t top_k, int64_t batch_size, int device, const char* precision, const char* algo,
                 const char** result_json, const char** text);

#ifdef __cplusplus
}
#endif

#endif /* LSTM_C_API_H */
