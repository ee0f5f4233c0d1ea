#include "lstm/parallel.hpp"

#include <omp.h>

#include "cpu/blas.hpp"

namespace lstm {

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  cpu::blas_set_num_threads(n);
}

std::string cpu_backend_description() { return cpu::blas_description(); }

}  // namespace lstm
