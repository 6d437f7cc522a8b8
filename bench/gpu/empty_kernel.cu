// Native reference for gpusanity's kernel-launch check: an empty kernel launched with the CUDA
// runtime from C++, measured the same two ways as the check (see
// executor/src/backend/cuda/launch.rs): host time per launch over a batch of asynchronous
// launches, and the launch + cudaStreamSynchronize round trip (median and best).
// Build: nvcc -O2 -o empty_kernel bench/gpu/empty_kernel.cu
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>

__global__ void empty() {}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 10000;
  int dev = argc > 2 ? atoi(argv[2]) : 0;
  cudaSetDevice(dev);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  using clk = std::chrono::steady_clock;
  for (int i = 0; i < 100; i++) empty<<<1, 1, 0, s>>>();
  cudaStreamSynchronize(s);
  auto t0 = clk::now();
  for (int i = 0; i < iters; i++) empty<<<1, 1, 0, s>>>();
  double launch_us = std::chrono::duration<double, std::micro>(clk::now() - t0).count() / iters;
  cudaStreamSynchronize(s);
  std::vector<double> trips(iters);
  for (int i = 0; i < iters; i++) {
    auto t = clk::now();
    empty<<<1, 1, 0, s>>>();
    cudaStreamSynchronize(s);
    trips[i] = std::chrono::duration<double, std::micro>(clk::now() - t).count();
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::sort(trips.begin(), trips.end());
  printf("native GPU %d: launch_us %.3f round_trip_us %.3f round_trip_best_us %.3f (%d launches)\n", dev, launch_us,
         trips[iters / 2], trips[0], iters);
  return 0;
}
