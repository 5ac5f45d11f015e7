// hiber-coverage's test program (built, never run): needs no CUDA library itself, only
// libcoverage_forwarder.so (found through RUNPATH $ORIGIN), whose CUDA imports hiber-coverage
// must find by following NEEDED.
#include <cstdio>

extern "C" int coverage_forwarder_texture_status();

int main() {
  int status = coverage_forwarder_texture_status();
  std::printf("transitive_user: %d\n", status);
  return status == 0 ? 0 : 1;
}
