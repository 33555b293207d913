// A tiny libtorch program: the native-link proof without tch-rs (crates.io is unreachable here).
// Built against the torch wheel's torch/lib, it needs LD_LIBRARY_PATH (or an rpath) to start, and
// with -Wl,--as-needed the linker drops libtorch.so from NEEDED: the tch-rs libtorch_cuda problem.
#include <torch/torch.h>

#include <iostream>

int main() {
  torch::Tensor a = torch::ones({2, 3});
  torch::Tensor b = torch::full({3, 2}, 2.0);
  torch::Tensor c = torch::matmul(a, b);
  std::cout << "libtorch_probe sum=" << c.sum().item<double>()
            << " cuda=" << (torch::cuda::is_available() ? 1 : 0) << std::endl;
  return 0;
}
