// Two small kernels for the fatbin harness's seeds (tests/fuzz/make_seeds.sh): parameters of
// several sizes and alignments, as the parsers' layout code must handle.
struct Pair {
  double a;
  char b;
};

extern "C" __global__ void scale(float* out, const float* in, float k, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * k;
}

__global__ void mixed(char c, Pair p, short s, long long* out, int arr[4]) {
  *out = c + static_cast<long long>(p.a) + p.b + s + arr[0];
}
