// CPU threading: one thread count for our own loops (OpenMP) and for BLAS (OpenBLAS).
#pragma once

#include <cstdint>

namespace lstm {

// Number of CPU threads used by lstm-engine. Defaults to OMP_NUM_THREADS or the core count.
int num_threads();
// Sets the thread count for our loops and for OpenBLAS. n <= 0 means the core count.
void set_num_threads(int n);

}  // namespace lstm
