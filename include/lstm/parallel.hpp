// CPU threading: one thread count for our own loops (OpenMP) and for BLAS (OpenBLAS).
#pragma once

#include <cstdint>
#include <string>

namespace lstm {

// Number of CPU threads used by lstm-engine. Defaults to OMP_NUM_THREADS or the core count.
int num_threads();
// Sets the thread count for our loops and for OpenBLAS. n <= 0 means the core count.
void set_num_threads(int n);
// The BLAS in use: library file and kernel family.
std::string cpu_backend_description();

}  // namespace lstm
