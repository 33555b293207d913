// A tiny libtorch program: the native-link proof without tch-rs (crates.io is unreachable here).
// Built against the torch wheel's torch/lib, it needs LD_LIBRARY_PATH (or an rpath) to start, and
// with -Wl,--as-needed the linker drops libtorch.so from NEEDED: the tch-rs libtorch_cuda problem.
// ATen and torch/cuda.h rather than torch/torch.h (the whole C++ frontend): the same libraries and
// the same NEEDED entries, half the compile time of the suite's slowest fixture.
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <iostream>

int main() {
  at::Tensor a = at::ones({2, 3});
  at::Tensor b = at::full({3, 2}, 2.0);
  at::Tensor c = at::matmul(a, b);
  std::cout << "libtorch_probe sum=" << c.sum().item<double>()
            << " cuda=" << (torch::cuda::is_available() ? 1 : 0) << std::endl;
  return 0;
}
