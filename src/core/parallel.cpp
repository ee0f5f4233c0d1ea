#include "lstm/parallel.hpp"

#include <omp.h>

extern "C" void openblas_set_num_threads(int);

namespace lstm {

int num_threads() { return omp_get_max_threads(); }

void set_num_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

}  // namespace lstm
